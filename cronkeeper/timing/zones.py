"""The tz database: which zone names exist, which are deprecated aliases, its version, and the
instants where a zone's UTC offset changes.

The database is the one ``zoneinfo`` reads: the first directory of ``zoneinfo.TZPATH`` that holds
``tzdata.zi`` (the system's, e.g. /usr/share/zoneinfo), else the ``tzdata`` package. Zone names
are those the database's ``tzdata.zi`` declares (Zone and Link lines), so host files that are not
zones (``localtime``, ``posixrules``, ``posix/...``, ``right/...``) are refused, and so is
``Factory``, a placeholder meaning "local time unknown" that no schedule can mean.
"""

from __future__ import annotations

import bisect
import difflib
import functools
import importlib.resources
import os
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cronkeeper.timing.errors import TimingError

EXCLUDED = frozenset({"Factory", "localtime", "posixrules"})
# Links that tz keeps in 'backward' but that every system and user still spells this way.
_NOT_DEPRECATED = frozenset({"UTC", "GMT"})


@dataclass(frozen=True, slots=True)
class Database:
    version: str
    names: frozenset[str]
    links: dict[str, str]  # link name -> target zone
    locations: frozenset[str]  # names zone.tab lists (current names of places)

    def alias_target(self, name: str) -> str | None:
        target = self.links.get(name)
        if target is None or name in self.locations or name in _NOT_DEPRECATED:
            return None
        return target


def _read_zi(text: str) -> tuple[str, set[str], dict[str, str]]:
    version = "unknown"
    names: set[str] = set()
    links: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# version "):
            version = line.split()[2]
        elif line.startswith("Z "):
            names.add(line.split()[1])
        elif line.startswith("L "):
            _, target, link = line.split()[:3]
            names.add(link)
            links[link] = target
    return version, names, links


def _read_zone_tab(text: str) -> set[str]:
    return {
        line.split("\t")[2]
        for line in text.splitlines()
        if line and not line.startswith("#") and line.count("\t") >= 2
    }


@functools.cache
def database() -> Database:
    """The tz database zoneinfo uses (read once)."""
    for directory in zoneinfo.TZPATH:
        zi = os.path.join(directory, "tzdata.zi")
        if os.path.isfile(zi):
            with open(zi, encoding="utf-8") as f:
                version, names, links = _read_zi(f.read())
            tab = os.path.join(directory, "zone.tab")
            locations: set[str] = set()
            if os.path.isfile(tab):
                with open(tab, encoding="utf-8") as f:
                    locations = _read_zone_tab(f.read())
            return Database(version, frozenset(names - EXCLUDED), links, frozenset(locations))
    try:
        package = importlib.resources.files("tzdata.zoneinfo")
        version, names, links = _read_zi((package / "tzdata.zi").read_text(encoding="utf-8"))
        locations = _read_zone_tab((package / "zone.tab").read_text(encoding="utf-8"))
    except (ModuleNotFoundError, FileNotFoundError):  # neither: take what zoneinfo can list
        names = {
            n for n in zoneinfo.available_timezones() if not n.startswith(("posix/", "right/"))
        }
        return Database("unknown", frozenset(names - EXCLUDED), {}, frozenset())
    return Database(version, frozenset(names - EXCLUDED), links, frozenset(locations))


def tzdata_version() -> str:
    """IANA version of the database in use, e.g. ``2025b``."""
    return database().version


def deprecated_zone_alias(name: str) -> str | None:
    """The canonical zone for a deprecated alias (``US/Eastern`` -> ``America/New_York``), else
    None. An alias is a Link of the database whose name zone.tab does not list as a place; so
    ``Europe/Oslo`` (a link in some builds, but Norway's name) and ``UTC`` are not deprecated."""
    return database().alias_target(name)


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise TimingError(f"timezone must be a string, not {type(name).__name__}")
    if name == "":
        raise TimingError("timezone is empty; use an IANA name such as 'Europe/London' or 'UTC'")
    if not name.isascii() or not name.isprintable():
        raise TimingError(f"timezone {name!r} contains a character that no zone name has")
    if name.startswith("/") or "\\" in name or ".." in name.split("/"):
        raise TimingError(f"timezone {name!r} is a path, not a zone name such as 'Europe/London'")
    return name


@functools.cache
def _load(name: str) -> zoneinfo.ZoneInfo:
    db = database()
    if name not in db.names:
        if name in EXCLUDED:
            raise TimingError(f"timezone {name!r} is not a real zone; use an IANA name")
        lowered = {n.lower(): n for n in db.names}
        close = [lowered[name.lower()]] if name.lower() in lowered else []
        close = close or difflib.get_close_matches(name, db.names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise TimingError(f"unknown timezone {name!r} (tz database {db.version}){hint}")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise TimingError(f"timezone {name!r} cannot be loaded: {exc}") from None


def load_zone(name: str) -> zoneinfo.ZoneInfo:
    """The zone named ``name``; TimingError for unknown names, paths and non-zones."""
    return _load(_check_name(name))


# --- offset transitions -------------------------------------------------------------------------

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SAMPLE = 6 * 3600  # two changes of offset closer than this (never seen in tz) would be missed
MIN_YEAR = 2
MAX_YEAR = 9998


def offset_at(zone: zoneinfo.ZoneInfo, ts: int) -> int:
    """UTC offset in seconds of ``zone`` at the Unix instant ``ts``."""
    offset = (EPOCH + timedelta(seconds=ts)).astimezone(zone).utcoffset()
    assert offset is not None
    return int(offset.total_seconds())


def year_start(year: int) -> int:
    return int((datetime(year, 1, 1, tzinfo=UTC) - EPOCH).total_seconds())


@functools.cache
def _year_transitions(zone: zoneinfo.ZoneInfo, year: int) -> tuple[tuple[int, int, int], ...]:
    """(instant, offset before, offset after) of each offset change in UTC year ``year``."""
    lo, hi = year_start(year), year_start(year + 1)
    found = []
    prev_t, prev_off = lo, offset_at(zone, lo)
    t = lo
    while t < hi:
        t = min(t + _SAMPLE, hi)
        off = offset_at(zone, t)
        if off != prev_off:
            a, b = prev_t, t  # offset(a) == prev_off != offset(b): bisect to the first second
            while b - a > 1:
                mid = (a + b) // 2
                if offset_at(zone, mid) == prev_off:
                    a = mid
                else:
                    b = mid
            found.append((b, prev_off, offset_at(zone, b)))
        prev_t, prev_off = t, off
    return tuple(found)


def transitions(zone: zoneinfo.ZoneInfo, start: int, end: int) -> list[tuple[int, int, int]]:
    """Offset changes with ``start <= instant < end`` (Unix seconds), ascending."""
    y0 = max(MIN_YEAR, (EPOCH + timedelta(seconds=max(start, year_start(MIN_YEAR)))).year)
    y1 = min(MAX_YEAR, (EPOCH + timedelta(seconds=min(end, year_start(MAX_YEAR)))).year)
    out: list[tuple[int, int, int]] = []
    for year in range(y0, y1 + 1):
        trs = _year_transitions(zone, year)
        i = bisect.bisect_left(trs, (start,))
        out.extend(tr for tr in trs[i:] if tr[0] < end)
    return out


def previous_transition(zone: zoneinfo.ZoneInfo, ts: int) -> tuple[int, int, int] | None:
    """The last offset change at or before ``ts``, looking back at most two years."""
    year = (EPOCH + timedelta(seconds=ts)).year
    for y in range(year, max(MIN_YEAR, year - 2) - 1, -1):
        trs = _year_transitions(zone, y)
        i = bisect.bisect_right(trs, (ts, 1 << 62))
        if i:
            return trs[i - 1]
    return None
