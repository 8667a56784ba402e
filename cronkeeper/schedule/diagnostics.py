"""Diagnostics: one problem found in the schedule files, with the file and line it is about.

Diagnostics hold the raw text a user wrote (a name with a terminal escape sequence stays as it
is, so JSON output is exact); :meth:`Diagnostic.render` escapes control characters for a
terminal with :func:`safe`, the one escaping helper of the project (``cli.common`` re-exports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


def safe(text: object) -> str:
    """Escape control characters (terminal escape sequences) before printing user-supplied text.

    C0 controls except tab, DEL and C1 controls become ``\\xNN``; so do the line separators and
    the bidirectional overrides and isolates that can make a printed line read differently from what it says.
    """
    s = str(text)
    if s.isprintable():  # the common case: nothing to escape (and no tab either)
        return s
    out = []
    for ch in s:
        code = ord(ch)
        if (code < 0x20 and ch != "\t") or 0x7F <= code < 0xA0:
            out.append(f"\\x{code:02x}")
        elif 0x2028 <= code <= 0x202E or 0x2066 <= code <= 0x2069:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One problem. ``line`` is 1-based; 0 means the diagnostic is about a path, not a line."""

    file: str
    line: int
    schedule: str | None
    message: str
    severity: Severity = Severity.ERROR

    def render(self) -> str:
        """``file:line: schedule 'name': message``, escaped for a terminal.

        Without a schedule: ``file:line: message``; without a line (a directory, a missing
        path): ``file: message``.
        """
        where = safe(self.file) if self.line <= 0 else f"{safe(self.file)}:{self.line}"
        if self.schedule is None:
            return f"{where}: {safe(self.message)}"
        return f"{where}: schedule '{safe(self.schedule)}': {safe(self.message)}"

    def to_json(self) -> dict[str, object]:
        return {
            "file": self.file,
            "line": self.line,
            "schedule": self.schedule,
            "message": self.message,
            "severity": str(self.severity),
        }
