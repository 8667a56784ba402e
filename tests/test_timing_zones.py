"""Durations, zone names, deprecated aliases and the tz database version."""

from __future__ import annotations

import ast
import pathlib
import zoneinfo

import pytest

import cronkeeper.timing as timing
from cronkeeper.timing import (
    TimingError,
    deprecated_zone_alias,
    load_zone,
    parse_duration,
    tzdata_version,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("15m", 900.0),
        ("6h", 21600.0),
        ("1d", 86400.0),
        ("1h30m", 5400.0),
        ("1d2h3m4s", 93784.0),
        ("0s", 0.0),
        ("1.5h", 5400.0),
        ("007s", 7.0),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "duration is empty"),
        ("5", "duration '5' has no unit"),
        ("-1m", "duration '-1m' is negative"),
        ("1x", "duration '1x' is not valid"),
        ("1.5.2h", "duration '1.5.2h' is not valid"),
        ("30m1h", "duration '30m1h' is not valid"),  # largest unit first
        ("1h1h", "duration '1h1h' is not valid"),
        ("1 h", "duration '1 h' is not valid"),
        ("15M", "duration '15M' is not valid"),
        ("\u0665m", "is not valid"),  # Arabic-Indic 5
        ("h", "duration 'h' is not valid"),
    ],
)
def test_parse_duration_errors(text: str, message: str) -> None:
    with pytest.raises(TimingError) as info:
        parse_duration(text)
    assert message in str(info.value)


@pytest.mark.parametrize("value", [None, 5, 1.5, b"5s"])
def test_parse_duration_non_string(value: object) -> None:
    with pytest.raises(TimingError, match="duration must be a string"):
        parse_duration(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["America/New_York", "UTC", "Europe/London", "US/Eastern"])
def test_load_zone(name: str) -> None:
    zone = load_zone(name)
    assert isinstance(zone, zoneinfo.ZoneInfo)
    assert zone.key == name


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "timezone is empty"),
        ("Mars/Olympus_Mons", "unknown timezone 'Mars/Olympus_Mons'"),
        ("america/new_york", "did you mean 'America/New_York'?"),
        ("Europe/Londn", "did you mean 'Europe/London'?"),
        ("../etc/passwd", "is a path"),
        ("America/../UTC", "is a path"),
        ("/usr/share/zoneinfo/UTC", "is a path"),
        ("localtime", "not a real zone"),
        ("posixrules", "not a real zone"),
        ("Factory", "not a real zone"),
        ("posix/America/New_York", "unknown timezone"),
        ("right/UTC", "unknown timezone"),
        ("UTC\x00", "contains a character"),
        ("Europe/Z\u00fcrich", "contains a character"),
    ],
)
def test_load_zone_errors(name: str, message: str) -> None:
    with pytest.raises(TimingError) as info:
        load_zone(name)
    assert message in str(info.value)


def test_load_zone_non_string() -> None:
    with pytest.raises(TimingError, match="timezone must be a string"):
        load_zone(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("US/Eastern", "America/New_York"),
        ("US/Pacific", "America/Los_Angeles"),
        ("Asia/Calcutta", "Asia/Kolkata"),
        ("Asia/Katmandu", "Asia/Kathmandu"),
        ("GB", "Europe/London"),
        ("Europe/Kiev", "Europe/Kyiv"),
        ("Etc/UCT", "Etc/UTC"),
        ("America/New_York", None),
        ("Asia/Kolkata", None),
        ("UTC", None),
        ("Europe/Oslo", None),  # a link in some builds, but Norway's own name (zone.tab)
        ("Nowhere/Else", None),
    ],
)
def test_deprecated_zone_alias(name: str, canonical: str | None) -> None:
    assert deprecated_zone_alias(name) == canonical


def test_tzdata_version_is_the_database_zoneinfo_reads() -> None:
    version = tzdata_version()
    assert len(version) == 5 and version[:4].isdigit() and version[4].isalpha(), version
    for directory in zoneinfo.TZPATH:
        zi = pathlib.Path(directory, "tzdata.zi")
        if zi.is_file():
            assert f"# version {version}\n" in zi.read_text()
            break
    else:
        import tzdata

        assert version == tzdata.IANA_VERSION


def test_timing_is_pure() -> None:
    """timing/ imports nothing from db/, cli/, worker/, nor sqlalchemy or psycopg; no clocks."""
    forbidden = ("cronkeeper.db", "cronkeeper.cli", "cronkeeper.worker", "sqlalchemy", "psycopg")
    package = pathlib.Path(timing.__file__).parent
    for path in package.glob("*.py"):
        source = path.read_text()
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert not name.startswith(forbidden), f"{path.name} imports {name}"
        assert ".now(" not in source and "time.time(" not in source, path.name
