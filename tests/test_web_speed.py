"""The schedules page's fast paths give the same answers as the slow ones.

- ``audit_states`` (states only, for the state filters) against ``audit_schedule`` (the
  ``history`` rows), row for row, on generated versions and records; ``holds`` (the filters'
  shortcut) against those rows, and the rows again without the records before ``start``;
- ``FireCache`` against ``fire_seconds`` as the window slides, jumps back and changes version;
- on a seeded PostgreSQL: every state filter lists exactly the schedules whose unfiltered
  strip (drawn by the full path) holds that state; a period recorded after a first render
  shows on the next; a new schedule version after a render is drawn from the new spec."""

from __future__ import annotations

import random
import re
from datetime import UTC, date, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from cronkeeper.audit import (
    Record,
    Version,
    audit_schedule,
    fire_seconds,
    unix,
)
from cronkeeper.period_states import audit_states, expected_tail, holds, judge, state_letter
from cronkeeper.schedule.model import Misfire, ScheduleSpec
from cronkeeper.timing.calendars import Calendar
from cronkeeper.web.fires import FireCache
from cronkeeper.web.strip import CellState

T0 = datetime(2026, 3, 7, 12, 0, tzinfo=UTC)  # a DST change in New York follows on the 8th
CRONS = [(None, "*/7 * * * *", "UTC"), (None, "30 2 * * *", "America/New_York"),
         (None, "15 * * * 1-5", "Europe/Berlin"), (60.0, None, "UTC"), (300.0, None, "UTC"),
         # with a calendar (below): unrecorded fires on its dates are skipped, not missing
         (None, "*/7 * * * *", "America/New_York"), (600.0, None, "Europe/Berlin")]
CALENDAR = Calendar.of("days-off", [date(2026, 3, 4), date(2026, 3, 6), date(2026, 3, 7)])
JOB = {"E": ("emitted", "succeeded"), "D": ("emitted", "dead"), "R": ("emitted", "running"),
       "S": ("skipped", None)}


def spec(kind: int, grace: float = 60, name: str = "s") -> ScheduleSpec:
    every, cron, tz = CRONS[kind]
    return ScheduleSpec(name=name, every=every, cron=cron, timezone=tz, misfire=Misfire.SKIP,
                        task="t", grace=grace, calendar=CALENDAR if kind >= 5 else None)


def record(at: int, letter: str) -> Record:
    outcome, job = JOB[letter]
    when = datetime.fromtimestamp(at, UTC)
    if outcome == "skipped":
        return Record.of(when, "skipped", "overlap")
    return Record.of(when, "emitted", emitted_at=when + timedelta(seconds=0.4), job_state=job,
                     attempts=1)


@settings(max_examples=150, deadline=None)
@given(kinds=st.lists(st.tuples(st.integers(0, len(CRONS) - 1), st.integers(0, 3000),
                                st.sampled_from([10.0, 600.0])), min_size=1, max_size=3),
       seed=st.integers(0, 2**32), span_hours=st.integers(1, 80),
       last=st.sampled_from([None, 0, 1, 48]), cached=st.booleans())
def test_audit_states_are_the_audits_rows(kinds, seed, span_hours, last, cached):
    rnd = random.Random(seed)
    versions, at = [], T0 - timedelta(hours=100)
    for i, (kind, step, grace) in enumerate(kinds):
        at += timedelta(minutes=step)
        versions.append(Version("s", i + 1, spec(kind, grace), at))
    now = T0 + timedelta(seconds=rnd.randrange(0, 86400))
    since = now - timedelta(hours=span_hours)
    expected = [t for v in versions for t in fire_seconds(v.spec.trigger(), since, now)]
    chosen = sorted(set(rnd.sample(expected, k=len(expected) // 2) if expected else [])
                    | {unix(since) + rnd.randrange(0, span_hours * 3600) for _ in range(3)})
    letters = {t: rnd.choice("EEDRS") for t in chosen}
    rows, _ = audit_schedule("s", versions, [record(t, c) for t, c in letters.items()],
                             since=since, until=now, now=now)
    want = [(unix(datetime.fromisoformat(r.scheduled_for.replace("Z", "+00:00"))),
             state_letter(r)) for r in rows]
    if last is not None:
        want = want[-last:] if last else []
    shuffled = dict(rnd.sample(sorted(letters.items()), k=len(letters)))  # any order will do
    got = audit_states(versions, shuffled, since=since, until=now, now=now, last=last,
                       fires=FireCache() if cached else None)
    assert got == want
    expected = expected_tail(versions, since=since, until=now, now=now, last=last)
    for letter in "ESDRPM":  # the filters' shortcut says what the rows say
        assert holds(expected, letters, letter) == any(c == letter for _, c in want), letter
    # the records before ``start`` (which the page leaves unread) change no row
    read = {t: c for t, c in letters.items() if t >= expected.start.timestamp()}
    assert judge(expected, read) == want
    if last:  # and the strips, audited from ``start`` on, draw the same last rows
        tail, _ = audit_schedule("s", versions, [record(t, c) for t, c in sorted(read.items())],
                                 since=expected.start, until=now, now=now)
        assert tail[-last:] == rows[-last:]
    if cached:  # the strips' own path, given the cache, draws the same rows
        cache = FireCache()
        for _ in range(2):  # cold, then from what the cache holds
            again, _ = audit_schedule("s", versions, [record(t, c) for t, c in letters.items()],
                                      since=since, until=now, now=now, fires=cache)
            assert again == rows


def test_fire_cache_slides_jumps_back_and_keeps_versions_apart():
    cache = FireCache()
    minutely = spec(3).trigger()
    daily = spec(1).trigger()
    for step in range(0, 200 * 60, 397):  # the window slides, sometimes past what was computed
        after, upto = T0 + timedelta(seconds=step), T0 + timedelta(seconds=step + 3 * 3600)
        assert cache(1, minutely, after, upto) == list(fire_seconds(minutely, after, upto))
    computed = cache.computed
    inside = (after + timedelta(minutes=10), upto + timedelta(minutes=30))
    assert cache(1, minutely, *inside) == list(fire_seconds(minutely, *inside))
    assert cache.computed == computed  # inside what is known (computed ahead): nothing computed
    back = (T0 - timedelta(days=3), T0)
    assert cache(1, minutely, *back) == list(fire_seconds(minutely, *back))  # before it: again
    # another version (the schedule changed): its own fires, the old entry untouched
    days = (T0 - timedelta(days=20), T0 + timedelta(days=1))
    assert cache(2, daily, *days) == list(fire_seconds(daily, *days))
    assert cache(1, minutely, *back) == list(fire_seconds(minutely, *back))
    assert cache(1, minutely, T0, T0) == []


# -- on a seeded database ------------------------------------------------------------------------


def strips_by_state(page: dict) -> dict[str, list[str]]:
    return {r["name"]: re.findall(r'data-state="(\w+)"', str(r["strip"])) for r in page["rows"]}


def test_state_filters_are_the_unfiltered_strips_filtered(engine):
    from web_seed import Seeder

    from cronkeeper.web import pages

    rnd = random.Random(12)
    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        seeder = Seeder(raw)
        now = seeder.now().replace(microsecond=0)
        for i in range(40):
            kind = i % len(CRONS)
            s = spec(kind, grace=rnd.choice([30.0, 3600.0]), name=f"s{i:02d}")
            vid = seeder.version(s, s.name, now - timedelta(days=9))
            trigger = s.trigger()
            fires = list(fire_seconds(trigger, now - timedelta(days=8), now))[-60:]
            for at in fires:
                roll = rnd.random()
                if roll < 0.1 * (i % 3):  # a third of the schedules miss nothing
                    continue
                when = datetime.fromtimestamp(at, UTC)
                letter = rnd.choice("EEEEEEEDRS") if i % 4 else "E"
                outcome, job = JOB[letter]
                seeder.period(s.name, vid, when, outcome, "overlap" if job is None else None,
                              job=(job, 1) if job else None)
            if i % 9 == 0:  # a recorded period no version implies (a hand-written row)
                extra = now - timedelta(seconds=17)
                if unix(extra) in fires:  # never a fire: schedules fire at most once a minute
                    extra -= timedelta(seconds=1)
                seeder.period(s.name, vid, extra, "emitted", job=("dead", 3))
        # two jobs for one period: the strip shows the first (by id), so does the filter
        s = spec(3, grace=3600, name="two-jobs")
        vid = seeder.version(s, s.name, now - timedelta(days=1))
        for at in list(fire_seconds(s.trigger(), now - timedelta(hours=2), now)):
            seeder.period(s.name, vid, datetime.fromtimestamp(at, UTC), "emitted",
                          job=("succeeded", 1))
            seeder.job(f"again-{at}", s.name, datetime.fromtimestamp(at, UTC), vid, "dead", 2)
        raw.commit()
    cache = pages.VersionsCache()
    cache.warm(engine)
    # Each render reads the database's clock: a fire, or a grace running out, between the
    # unfiltered render and a filtered one changes a strip between them (a new period pending,
    # one pending turned missing), as it would for two visitors. Such an instant passes in
    # under a second and comes at most a few times a minute, so a comparison that straddles
    # one is made again; a filter that is wrong is wrong on every try.
    for _ in range(3):
        mismatches, seen, full = _filters_against_full(engine, cache, pages)
        if not mismatches:
            break
    assert mismatches == []
    assert len(full) == 41 and set(full["two-jobs"]) <= {"emitted", "pending"}
    assert seen >= {"emitted", "skipped", "missing", "dead", "running", "pending"}


def _filters_against_full(engine, cache, pages) -> tuple[list, set, dict]:
    """Each state filter's rows (and a later page of them, on a cold cache) against the
    unfiltered strips: the mismatches, the states seen, and the unfiltered strips."""
    full = strips_by_state(pages.schedules(engine, cache, per_page=10_000))
    mismatches: list = []
    seen: set = set()
    for state in CellState:
        listed = [r["name"] for r in pages.schedules(engine, cache, state=state.value,
                                                     per_page=10_000)["rows"]]
        expected = sorted(n for n, cells in full.items() if state.value in cells)
        if listed != expected:
            mismatches.append((state.value, listed, expected))
        seen.update(s for n in listed for s in full[n])
        paged = pages.schedules(engine, pages.VersionsCache(), state=state.value, per_page=3,
                                page=2)  # a cold cache, and a later page
        if [r["name"] for r in paged["rows"]] != listed[3:6]:
            mismatches.append((f"{state.value}, page 2", paged["rows"], listed[3:6]))
    return mismatches, seen, full


def test_a_period_decided_after_a_render_shows_on_the_next(engine):
    from web_seed import Seeder

    from cronkeeper.web import pages

    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        seeder = Seeder(raw)
        now = seeder.now()
        s = spec(3, grace=600, name="late")  # periods due while the test runs are pending
        vid = seeder.version(s, "late", now - timedelta(hours=3))
        fires = [datetime.fromtimestamp(t, UTC) for t in
                 fire_seconds(s.trigger(), now - timedelta(hours=3), now)]
        late = fires[-40:-37]  # three periods about 40 minutes ago, never decided
        for when in fires:
            if when not in late:
                seeder.period("late", vid, when, "emitted", job=("succeeded", 1))
        raw.commit()
        cache = pages.VersionsCache()
        first = strips_by_state(pages.schedules(engine, cache))["late"]
        assert first.count("missing") == 3
        assert [r["name"] for r in pages.schedules(engine, cache, state="missing")["rows"]] == [
            "late"]
        for when in late:  # the leader decides them late (a backfill, say)
            seeder.period("late", vid, when, "skipped", "misfire")
        raw.commit()
        again = strips_by_state(pages.schedules(engine, cache))["late"]
        assert "missing" not in again and again.count("skipped") == 3
        assert pages.schedules(engine, cache, state="missing")["rows"] == []
        assert [r["name"] for r in pages.schedules(engine, cache, state="skipped")["rows"]] == [
            "late"]


def test_a_new_version_after_a_render_is_drawn_from_its_spec(engine):
    from web_seed import Seeder

    from cronkeeper.web import pages
    from cronkeeper.web.strip import strip_rows

    with engine.connect() as conn:
        raw = conn.connection.driver_connection
        seeder = Seeder(raw)
        now = seeder.now()
        seeder.version(spec(3, grace=10, name="v"), "v", now - timedelta(hours=3))
        raw.commit()
        cache = pages.VersionsCache()
        before = pages.schedules(engine, cache)["rows"][0]
        assert "vmark" not in str(before["strip"])
        assert "missing" in set(strips_by_state({"rows": [before]})["v"]) <= {"missing", "pending"}
        five = ScheduleSpec(name="v", every=300.0, timezone="UTC", misfire=Misfire.SKIP,
                            task="t", grace=10)
        changed = now - timedelta(minutes=40)
        seeder.version(five, "v", changed)
        raw.commit()
        page = pages.schedules(engine, cache)
        row = page["rows"][0]
        assert row["cron"] == "every 300s" and 'class="vmark"' in str(row["strip"])
        at = re.findall(r'data-at="([^"]+)"', str(row["strip"]))
        after = [a for a in at if datetime.fromisoformat(a.replace("Z", "+00:00")) > changed]
        assert after and all(a[14:16] in {f"{m:02d}" for m in range(0, 60, 5)} and a[17:19] == "00"
                             for a in after)
        versions = cache.get(conn)["v"]
        uncached = strip_rows("v", versions, [], since=now - timedelta(hours=10),
                              now=datetime.fromisoformat(page["now"].replace("Z", "+00:00")))
        assert at == [r.scheduled_for for r in uncached][-len(at):]
        conn.rollback()
