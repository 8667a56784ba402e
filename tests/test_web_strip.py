"""The web's pure parts as tables of cases: the strip's cells from the audit (states, order,
tooltips in the schedule's zone, version marks), its SVG (escaped, a shape and a letter per
state, counts in the aria-label), cron in words, and the security helpers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cronkeeper.audit import Record, Version
from cronkeeper.errors import UsageError
from cronkeeper.schedule.model import Misfire, ScheduleSpec
from cronkeeper.timing.describe import describe
from cronkeeper.web import security
from cronkeeper.web.strip import CellState, build_strip, relative, window_start
from cronkeeper.web.svg import strip_svg

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def spec(every: float = 60, tz: str = "UTC", description: str | None = None) -> ScheduleSpec:
    return ScheduleSpec(name="s", every=every, timezone=tz, misfire=Misfire.SKIP, task="t",
                        grace=10, description=description)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def test_cells_follow_the_audit_in_order_with_version_marks():
    versions = [Version("s", 1, spec(60), T0), Version("s", 2, spec(120), at(4.5))]
    records = [Record.of(at(1), "emitted", emitted_at=at(1), job_state="succeeded", attempts=1),
               Record.of(at(2), "skipped", "overlap"),
               Record.of(at(4), "emitted", emitted_at=at(4), job_state="dead", attempts=5),
               Record.of(at(6), "emitted", emitted_at=at(6), job_state="running", attempts=1)]
    strip = build_strip("s", versions, records, since=T0, now=at(10) + timedelta(seconds=5))
    states = [c.state for c in strip.cells]
    assert states == [CellState.EMITTED, CellState.SKIPPED, CellState.MISSING, CellState.DEAD,
                      CellState.RUNNING, CellState.MISSING, CellState.PENDING]
    assert [(m.before, m.version_id) for m in strip.marks] == [(4, 2)]
    assert "reason: overlap" in strip.cells[1].title
    assert "job dead after 5 attempts" in strip.cells[3].title
    assert strip.label() == ("last 7 periods of s: 1 emitted, 1 skipped, 2 missing, 1 dead, "
                             "1 running, 1 pending; schedule changed 1 time")
    # only the last N periods, and no mark when the change is before the first of them
    short = build_strip("s", versions, records, since=T0, now=at(10), periods=2)
    assert [c.scheduled_for for c in short.cells] == ["2026-03-01T12:08:00Z",
                                                      "2026-03-01T12:10:00Z"]
    assert short.marks == ()


def test_tooltips_name_the_local_time_in_the_schedules_zone():
    versions = [Version("s", 1, spec(3600, tz="America/New_York"), at(0))]
    strip = build_strip("s", versions, [], since=at(0), now=at(61))
    assert strip.cells[0].title.startswith("2026-03-01 08:00:00 EST (UTC-0500), "
                                           "2026-03-01T13:00:00Z: missing")


def test_svg_escapes_and_draws_a_shape_and_letter_per_state():
    versions = [Version("s", 1, spec(60), T0)]
    records = [Record.of(at(1), "skipped", "<b>x</b>")]
    svg = str(strip_svg(build_strip("<script>", versions, records, since=T0, now=at(2.5))))
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "<b>" not in svg
    assert svg.count('data-state="skipped"') == 1 and svg.count('data-state="missing"') == 1
    assert ">S</text>" in svg and ">M</text>" in svg and "<title>" in svg
    waiting = [Record.of(at(1), "emitted", emitted_at=at(1), job_state="available", attempts=0),
               Record.of(at(2), "emitted", emitted_at=at(2), job_state="succeeded", attempts=1)]
    svg = str(strip_svg(build_strip("s", versions, waiting, since=T0, now=at(2.5))))
    assert svg.count('class="cell s-emitted waiting"') == 1  # hollow: no worker took it yet
    assert svg.count('class="cell s-emitted"') == 1
    assert "no period due yet" in str(strip_svg(build_strip("s", versions, [], since=T0,
                                                              now=T0)))


def test_window_reaches_back_far_enough_but_not_past_retention():
    v = [Version("s", 1, spec(60), T0 - timedelta(days=30))]
    start = window_start(v, T0, 48, 400)
    assert T0 - start >= timedelta(minutes=48)
    assert window_start([Version("s", 1, spec(86400 * 30), T0 - timedelta(days=3000))], T0, 48,
                        400) == T0 - timedelta(days=400)


@pytest.mark.parametrize(("cron", "every", "words"), [
    ("30 4 * * *", None, "at 04:30, every day"),
    ("*/5 * * * *", None, "every 5 minutes"),
    ("5 * * * *", None, "at minute 5 of every hour"),
    ("0 6 1 * *", None, "at 06:00, on day 1 of the month"),
    ("30 3 * * 1-5", None, "at 03:30, on Monday to Friday"),
    ("0 0 * * sun", None, "at 00:00, on Sunday"),
    ("*/10 * * * * *", None, "every 10 seconds"),
    ("@hourly", None, "every hour, at minute 0"),
    ("0 0 L * *", None, "at 00:00, on the last day of the month"),
    ("0 0 1,L-3 * *", None, "at 00:00, on day 1 and 3 days before the last day of the month"),
    ("0 9 * * 5L", None, "at 09:00, on the last Friday of the month"),
    ("0 9 * * mon#2,FRIL", None, "at 09:00, on the second Monday and the last Friday of the month"),
    (None, 90, "every 90 seconds"),
    (None, 900, "every 15 minutes"),
])
def test_cron_in_words(cron, every, words):
    assert describe(cron, every) == words


def test_relative_times():
    assert relative(90) == "in 2 min" and relative(-7200) == "2 h ago" and relative(5) == "in 5 s"


def test_security_helpers():
    config = security.WebConfig.make("127.0.0.1", 9480, None, False, ["dash.example"])
    assert security.host_allowed("127.0.0.1:9480", config)
    assert security.host_allowed("LOCALHOST", config)
    assert security.host_allowed("dash.example:443", config)
    assert not security.host_allowed("evil.example", config)
    assert not security.host_allowed(None, config)
    v6 = security.WebConfig.make("::1", 9480, None, False)
    assert security.host_allowed("[::1]:9480", v6) and not security.host_allowed("[::2]:1", v6)
    assert security.is_loopback("127.0.0.2") and security.is_loopback("::1")
    assert not security.is_loopback("0.0.0.0") and not security.is_loopback("10.0.0.1")
    with pytest.raises(UsageError, match="needs a token"):
        security.check_bind("0.0.0.0", None)
    security.check_bind("0.0.0.0", "t")
    assert security.cross_site("cross-site") and security.cross_site("same-site")
    assert not security.cross_site("same-origin") and not security.cross_site(None)
    token = security.WebConfig.make("127.0.0.1", 1, "tok", False)
    assert token.csrf_token("a") != token.csrf_token("b") != config.csrf_token("b")
    assert token.auth_cookie("a") == security.WebConfig.make("127.0.0.1", 1, "tok", True).auth_cookie("a")
    with pytest.raises(UsageError):
        security.parse_address("9480")
    for bad in ("//evil.example", "/\\evil.example", "https://evil.example", "", None,
                "/ok\nSet-Cookie: x", "/a\\b"):
        assert security.local_path(bad) == "/", bad
    assert security.local_path("/queue?refresh=30") == "/queue?refresh=30"
