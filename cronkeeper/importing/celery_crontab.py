"""A Celery ``crontab`` -> cron text (for ``cronkeeper import celery-beat``, docs/import.md).

Every argument is converted. A field given as a string cronkeeper reads to the same set is kept
as written, so ``minute="*/15"`` keeps cron's elapsed-time DST rule; other fields are written
from Celery's expanded set. Where Celery differs from cron: Celery fires only on days matching
day_of_month AND day_of_week (cron: either, when both are restricted). That is expressible only
when one of the two is written starting with ``*``; otherwise refused.
"""

from __future__ import annotations

from typing import Any

from cronkeeper.timing import TimingError, parse_cron, uses_hash

_FIELDS = (  # (crontab attribute, cron position, low, high)
    ("minute", 0, 0, 59),
    ("hour", 1, 0, 23),
    ("day_of_month", 2, 1, 31),
    ("month_of_year", 3, 1, 12),
    ("day_of_week", 4, 0, 6),
)
_CRON_ATTR = {0: "minutes", 1: "hours", 2: "days", 3: "months", 4: "weekdays"}


def _field_text(orig: Any, values: set[int], position: int, low: int, high: int) -> str:
    """The cron text of one crontab field: as written when cronkeeper reads it to Celery's set."""
    if isinstance(orig, str):
        text = orig.strip().replace(" ", "")
        fields = ["*"] * 5
        fields[position] = text
        try:  # cronkeeper's own H, L and # are never written for a Celery field
            expr = " ".join(fields)
            found = None if uses_hash(expr) else parse_cron(expr)
            parsed = (set(getattr(found, _CRON_ATTR[position]))
                      if found is not None and not found.extensions else None)  # fmt: skip
        except TimingError:
            parsed = None
        if parsed == values:
            return text
    if values == set(range(low, high + 1)):
        return "*"
    runs: list[str] = []
    ordered = sorted(values)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)


def crontab_cron(sched: Any) -> tuple[str | None, str | None, list[str]]:
    """(cron text, reason it cannot be converted, warnings) of a Celery ``crontab``."""
    texts = []
    for attr, position, low, high in _FIELDS:
        texts.append(_field_text(getattr(sched, f"_orig_{attr}"), set(getattr(sched, attr)),
                                 position, low, high))  # fmt: skip
    dom_all = set(sched.day_of_month) == set(range(1, 32))
    dow_all = set(sched.day_of_week) == set(range(7))
    if not dom_all and not dow_all and not (texts[2].startswith("*") or texts[4].startswith("*")):
        return None, (
            f"day_of_month={sched._orig_day_of_month!r} and day_of_week="
            f"{sched._orig_day_of_week!r}: Celery fires only on days matching both; cron (and "
            "cronkeeper) fire on days matching either when both are restricted, and no cron "
            "expression says 'both' for these sets. Split it into schedules, or restrict one "
            "field only"
        ), []  # fmt: skip
    warnings = []
    if texts[0] == "*" and texts[1] != "*":
        warnings.append(
            f"minute is '*' with hour {texts[1]!r}: it fires every minute of those hours, as in "
            "Celery; was crontab(minute=0, ...) meant?"
        )
    return " ".join(texts), None, warnings
