"""The audit against the planner it audits (§9): a simulated leader drives the real planner
(``planning.plan`` over ``Trigger.fires``, with the daemon's rules for where each version
starts) over a timeline of ticks, outages, spec changes, removals, re-puts, pauses, busy jobs
and leader restarts, in zones with odd DST; the audit of what it recorded must list every
decided period with its outcome and nothing missing, and must call a dropped one missing.
Pure: no database, no clock (the daemon tests check the same end to end)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronkeeper.audit import Record, Version, audit_schedule, expected, iso_second, unix
from cronkeeper.period_states import audit_states, state_letter
from cronkeeper.planning import ALWAYS_PAUSED, Outcome, plan
from cronkeeper.schedule.model import Misfire, OnCalendar, Overlap, ScheduleSpec
from cronkeeper.timing.calendars import Calendar

TICK = timedelta(microseconds=1)  # as runtime_adoption.TICK

# Instants near offset changes: Lord Howe's 30-minute DST, Dublin's negative DST, Apia's
# skipped 2011-12-30, Kathmandu's +05:45, New York's ordinary one, and UTC.
BASES = [
    ("Australia/Lord_Howe", datetime(2026, 4, 4, 12, tzinfo=UTC)),
    ("Australia/Lord_Howe", datetime(2026, 10, 3, 12, tzinfo=UTC)),
    ("Europe/Dublin", datetime(2026, 3, 28, 20, tzinfo=UTC)),
    ("Europe/Dublin", datetime(2026, 10, 24, 20, tzinfo=UTC)),
    ("Pacific/Apia", datetime(2011, 12, 28, 12, tzinfo=UTC)),
    ("America/New_York", datetime(2026, 11, 1, 0, tzinfo=UTC)),
    ("America/New_York", datetime(2026, 3, 7, 20, tzinfo=UTC)),
    ("Asia/Kathmandu", datetime(2026, 5, 30, 0, tzinfo=UTC)),
    ("UTC", datetime(2026, 2, 26, 0, tzinfo=UTC)),
]
CRONS = ["30 2 * * *", "0 2 * * *", "*/30 * * * *", "15 1-3 * * *", "45 23 * * *", "0 0 * * *",
         "H H * * *", "H(0-29)/20 * * * *", "0 0 L * *", "30 1 * * 0#1", "0 3 * * 0L",
         "0,30 0-4 * * *", "0 */3 * * *", "30 0 29-31 12 *"]
EVERYS = [60.0, 1800.0, 5400.0, 86400.0]


@st.composite
def specs(draw, zone: str, base: datetime) -> ScheduleSpec:
    if draw(st.booleans()):
        cron, every = draw(st.sampled_from(CRONS)), None
    else:
        cron, every = None, draw(st.sampled_from(EVERYS))
    if draw(st.booleans()):  # a calendar of local dates around the base
        first = base.date() - timedelta(days=1)
        days = draw(st.sets(st.integers(0, 5), max_size=3))
        calendar = Calendar.of("c", [first + timedelta(days=d) for d in days])
        on = draw(st.sampled_from(list(OnCalendar)))
    else:
        calendar, on = None, OnCalendar.SKIP
    zone = draw(st.sampled_from([zone, zone, "UTC", "Pacific/Chatham"]))
    return ScheduleSpec(
        "s", zone, draw(st.sampled_from(list(Misfire))), cron=cron, every=every, task="t",
        grace=draw(st.sampled_from([1.0, 60.0, 900.0, 7200.0])),
        catch_up_limit=draw(st.sampled_from([60.0, 3600.0, 86400.0])),
        overlap=draw(st.sampled_from(list(Overlap))), calendar=calendar, on_calendar=on)


@dataclass
class Leader:
    """The daemon's bookkeeping for one schedule, by its rules (``versions``,
    ``runtime_adoption``, ``scheduler``): the versions it records and the periods it decides."""

    versions: list[Version] = field(default_factory=list)
    records: dict[int, Record] = field(default_factory=dict)
    spec: ScheduleSpec | None = None
    after: datetime | None = None
    ids: int = 0

    def record_version(self, spec: ScheduleSpec | None, active_from: datetime) -> None:
        self.ids += 1
        self.versions.append(Version("s", self.ids, spec, active_from))

    def tick(self, now: datetime, *, paused: bool, busy: bool) -> None:
        if self.spec is None or self.after is None:
            return
        due = list(self.spec.trigger().fires(self.after, now))
        if not due:
            return
        decided_at = now + timedelta(milliseconds=5)  # the tick's confirm: a moment later
        for d in plan(self.spec, due, decided_at, paused=ALWAYS_PAUSED if paused else (),
                     busy=busy):
            emitted = d.outcome is Outcome.EMITTED
            self.records[unix(d.scheduled_for)] = Record.of(
                d.scheduled_for, d.outcome.value, d.reason.value if d.reason else None,
                decided_at if emitted else None, "succeeded" if emitted else None)
        self.after = due[-1]

    # Each change is adopted right after a tick at ``at`` (that tick's horizon).
    def put_file(self, spec: ScheduleSpec, at: datetime) -> None:
        if self.spec is not None and self.spec == spec:
            return
        self.record_version(spec, at)
        self.spec, self.after = spec, at

    def remove_file(self, at: datetime) -> None:
        if self.spec is not None:
            self.record_version(None, at)
            self.spec = self.after = None

    def delete_runtime(self) -> None:
        if self.spec is not None and self.after is not None:
            self.record_version(None, self.after + TICK)
            self.spec = self.after = None

    def recreate_runtime(self, spec: ScheduleSpec, at: datetime) -> None:
        """Deleted and put again between two looks: removed just after the last decided
        period, the new incarnation from the horizon."""
        if self.spec is None or self.after is None:
            self.put_file(spec, at)
            return
        self.record_version(None, self.after + TICK)
        start = max(at, self.after + 2 * TICK)
        self.record_version(spec, start)
        self.spec, self.after = spec, start

    def restart(self) -> None:
        """A new term reads back the version in force and the last decided period."""
        if not self.versions or self.versions[-1].spec is None:
            self.spec = self.after = None
            return
        v = self.versions[-1]
        last = max(self.records, default=None)
        after = v.active_from if last is None else max(
            datetime.fromtimestamp(last, UTC), v.active_from)
        self.spec, self.after = v.spec, after


STEPS = st.sampled_from([1, 20, 60, 300, 1800, 3600, 5400, 4 * 3600, 30 * 3600])
ACTIONS = st.sampled_from(["tick"] * 6 + ["paused", "busy", "change", "remove", "delete",
                                           "recreate", "restart", "outage"])


@st.composite
def timelines(draw):
    zone, base = draw(st.sampled_from(BASES))
    start = base - timedelta(seconds=draw(st.integers(0, 2 * 86400)))
    leader = Leader()
    leader.put_file(draw(specs(zone, base)), start)
    now = start
    for _ in range(draw(st.integers(1, 14))):
        action = draw(ACTIONS)
        now += timedelta(seconds=draw(STEPS), microseconds=draw(st.integers(0, 999_999)))
        if action == "outage":  # no leader: nothing decided until the next tick
            continue
        leader.tick(now, paused=action == "paused", busy=action == "busy")
        if action == "change":
            leader.put_file(draw(specs(zone, base)), now)
        elif action == "remove":
            leader.remove_file(now)
        elif action == "delete":
            leader.delete_runtime()
        elif action == "recreate":
            leader.recreate_runtime(draw(specs(zone, base)), now)
        elif action == "restart":
            leader.restart()
        if leader.spec is None and draw(st.booleans()):  # put again later
            now += timedelta(seconds=draw(STEPS))
            leader.put_file(draw(specs(zone, base)), now)
    now += timedelta(seconds=draw(STEPS))
    leader.tick(now, paused=False, busy=False)  # every period up to now is decided
    return leader, start, now


def audited(leader: Leader, records: list[Record], since: datetime, until: datetime,
            now: datetime) -> list[tuple[str, str, str | None]]:
    rows, _ = audit_schedule("s", leader.versions, records, since=since, until=until, now=now)
    letters = audit_states(leader.versions, {r.at: "E" if r.outcome == "emitted" else "S"
                                             for r in records}, since=since, until=until, now=now)
    assert [(iso_second(at), letter) for at, letter in letters] == [
        (r.scheduled_for, "E" if r.status == "emitted" else state_letter(r)) for r in rows]
    return [(r.scheduled_for, r.status, r.reason) for r in rows]


SETTINGS = settings(derandomize=True, max_examples=300, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(timelines(), st.data())
def test_the_audit_of_what_the_planner_decided_lists_it_all_and_nothing_missing(sim, data):
    leader, start, now = sim
    records = [leader.records[k] for k in sorted(leader.records)]
    rows = audited(leader, records, start - timedelta(days=1), now, now)
    assert rows == [(iso_second(r.at), r.outcome, r.reason) for r in records]
    implied = {unix(t) for t, _ in expected(leader.versions, start - timedelta(days=1), now)}
    assert implied == set(leader.records)  # no decided period that no version implies

    # a window cut anywhere: the same rows, those inside it
    lo = data.draw(st.integers(unix(start) - 3600, unix(now)))
    hi = data.draw(st.integers(lo, unix(now) + 3600))
    since = datetime.fromtimestamp(lo, UTC) + timedelta(microseconds=data.draw(
        st.sampled_from([0, 1, 500_000])))
    until = datetime.fromtimestamp(hi, UTC)
    inside = [r for r in records if since <= datetime.fromtimestamp(r.at, UTC) <= until]
    assert audited(leader, inside, since, until, now) == [
        (iso_second(r.at), r.outcome, r.reason) for r in inside]

    # a period that vanished is missing (or pending within its grace), never hidden
    if records:
        gone = data.draw(st.sampled_from(records))
        rest = [r for r in records if r is not gone]
        row = dict((at, (status, reason)) for at, status, reason in audited(
            leader, rest, start - timedelta(days=1), now, now))[iso_second(gone.at)]
        if gone.reason == "calendar":  # never to fire: nothing was lost
            assert row == ("skipped", "calendar")
        else:
            assert row[0] in ("missing", "pending"), row


def test_apia_skipped_day_and_lord_howe_half_hour():
    """Two cases the property test draws, spelled out: nothing missing across them."""
    for zone, cron, base in [("Pacific/Apia", "30 12 * * *", datetime(2011, 12, 28, tzinfo=UTC)),
                             ("Australia/Lord_Howe", "45 1 * * *", datetime(2026, 4, 3,
                                                                              tzinfo=UTC))]:
        leader = Leader()
        cal = Calendar.of("c", [date(2011, 12, 29)])
        leader.put_file(ScheduleSpec("s", zone, Misfire.CATCH_UP, cron=cron, task="t",
                                     catch_up_limit=86400.0, calendar=cal,
                                     on_calendar=OnCalendar.NEXT_DAY), base)
        end = base + timedelta(days=4)
        leader.tick(base + timedelta(days=2), paused=False, busy=False)
        leader.tick(end, paused=False, busy=False)
        rows = audited(leader, [leader.records[k] for k in sorted(leader.records)], base, end,
                       end)
        assert rows and all(status != "missing" for _, status, _ in rows)
