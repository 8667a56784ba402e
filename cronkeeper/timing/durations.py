"""Durations written as ``90s``, ``15m``, ``6h``, ``1d`` or combined, ``1h30m``."""

from __future__ import annotations

import re

from cronkeeper.timing.errors import TimingError

_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
# One optional component per unit, largest first; [0-9] (never \d, which takes any Unicode digit).
_NUMBER = r"[0-9]+(?:\.[0-9]+)?"
_DURATION = re.compile("".join(f"(?:(?P<{u}>{_NUMBER}){u})?" for u in "dhms"))
_HINT = "write a number and a unit (s, m, h, d), e.g. 90s, 15m, 6h, 1d or 1h30m"


def parse_duration(text: str) -> float:
    """Seconds in ``text``. Units s, m, h, d, largest first, each at most once; decimals allowed
    ("1.5h"); nothing negative, no bare numbers, no spaces."""
    if not isinstance(text, str):
        raise TimingError(f"duration must be a string such as '15m', not {type(text).__name__}")
    if text == "":
        raise TimingError(f"duration is empty; {_HINT}")
    match = _DURATION.fullmatch(text)
    if match is None or not any(match.groups()):
        if re.fullmatch(_NUMBER, text):
            raise TimingError(f"duration {text!r} has no unit; {_HINT}")
        if text.startswith("-"):
            raise TimingError(f"duration {text!r} is negative; {_HINT}")
        raise TimingError(f"duration {text!r} is not valid; {_HINT}")
    return float(sum(float(v) * _UNIT_SECONDS[u] for u, v in match.groupdict().items() if v))
