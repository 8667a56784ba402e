"""What each page shows, read from the database through ``db/`` and the CLI's own functions
(``status.gather``, ``history.collect``, ``dlq.select_dead``, ``explain.story``), so a page
and its JSON mirror never disagree. Returns plain values for the templates."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any
from zoneinfo import ZoneInfo

from cronkeeper.audit import (
    DEFAULT_RETENTION_DAYS,
    Version,
    records_from_rows,
    spec_in_force,
    specs_in_force,
    versions_from_rows,
)
from cronkeeper.db import outbox as dbo
from cronkeeper.db.attempts import attempts_recent, attempts_runtimes
from cronkeeper.db.engine import translate_errors
from cronkeeper.db.instances import instances_all
from cronkeeper.db.periods import (
    periods_latest,
    periods_range,
    periods_window_states,
    periods_windows,
)
from cronkeeper.db.runtime_schedules import runtime_live_among, runtime_live_names
from cronkeeper.db.schedule_controls import controls_paused
from cronkeeper.db.schedule_versions import versions_after, versions_all, versions_stamp
from cronkeeper.db.sessions import session_snapshot, session_utc
from cronkeeper.period_states import audit_states, expected_tail, holds
from cronkeeper.planning import calendar_mark
from cronkeeper.runtimes import SAMPLE, Runtime, figures, json_fields, runtime_of
from cronkeeper.timing.describe import describe
from cronkeeper.timing.dst import dst_anomalies
from cronkeeper.web.fires import FireCache
from cronkeeper.web.strip import (
    LETTER,
    CellState,
    Strip,
    build_strip,
    relative,
    strip_from_rows,
    strip_rows,
    utc,
    window_start,
)
from cronkeeper.web.svg import strip_svg

PER_PAGE = 100
# Filters whose answer depends on the jobs' states (an emitted period whose job is dead is
# drawn dead, not emitted); the others need only the periods.
JOB_FILTERS = {CellState.EMITTED, CellState.DEAD, CellState.RUNNING}
# Filters on periods that have no record: which periods were recorded is all they need.
UNRECORDED = {CellState.MISSING, CellState.PENDING}
LIVE_WITHIN = 30.0  # seconds: an instance whose heartbeat is older is marked stale
FAR = datetime(9999, 1, 1, tzinfo=UTC)


class VersionsCache:
    """Parsed schedule versions, kept between requests: parsing ten thousand stored specs costs
    more than the page. ``schedule_versions`` is only ever appended to, so a request reads just
    the rows added since (an empty range scan when nothing changed) and parses those; when the
    row count says rows went away (a hand edit), it reads everything again. Trigger objects,
    each version's expected fires (``FireCache``) and its period length are kept per version
    id too: a version id never changes meaning, so none of them needs invalidating."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] = (0, 0)
        self._versions: dict[str, list[Version]] = {}
        self.triggers: dict = {}
        self.lengths: dict = {}
        self.fires = FireCache()

    def get(self, conn: Any) -> dict[str, list[Version]]:
        stamp = versions_stamp(conn)
        with self._lock:
            if stamp == self._stamp:
                return self._versions
            top, count = self._stamp
            fresh = versions_after(conn, top) if stamp[0] >= top else []
            if stamp[0] < top or count + len(fresh) != stamp[1]:
                self._versions = versions_from_rows(versions_all(conn))
                self.triggers, self.lengths = {}, {}
                self.fires.clear()
            else:
                merged = {name: list(vs) for name, vs in self._versions.items()}
                for name, added in versions_from_rows(fresh).items():
                    rows = merged.setdefault(name, [])
                    rows.extend(added)
                    rows.sort(key=lambda v: (v.active_from, v.version_id))
                self._versions = merged
            self._stamp = stamp
            return self._versions

    def warm(self, engine: Any, periods: int = 48,
             retention_days: float = DEFAULT_RETENTION_DAYS) -> int:
        """Read and parse every version now (at start), and compute each schedule's window
        and expected fires, so no visitor waits for them (the first state filter would)."""
        with translate_errors("reading the schedules"), engine.connect() as conn:
            now = session_utc(conn)
            versions = self.get(conn)
            conn.rollback()
        for vs in versions.values():
            if vs[-1].spec is not None:
                since = window_start(vs, now, periods, retention_days, self.triggers,
                                     self.lengths)
                audit_states(vs, {}, since=since, until=now, now=now, triggers=self.triggers,
                             fires=self.fires, last=periods)
        return len(versions)


_quiet_lock = threading.Lock()
_quiet_count = 0


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused while any request builds a page (a 10,000-row page
    allocates a million tuples and strings, none in a cycle; the collector's passes over them
    were a seventh of its time). Counted, so one request ending does not resume it under
    another; objects are still freed by reference counting meanwhile."""
    global _quiet_count
    with _quiet_lock:
        _quiet_count += 1
        gc.disable()
    try:
        yield
    finally:
        with _quiet_lock:
            _quiet_count -= 1
            if _quiet_count == 0:
                gc.enable()


def _local(when: datetime | None, zone: ZoneInfo) -> str | None:
    return when.astimezone(zone).isoformat() if when else None


def _next_after(version: Version, latest: tuple | None) -> datetime:
    return max(version.active_from, latest[0]) if latest else version.active_from


def schedules(engine: Any, cache: VersionsCache, *, owner: str | None = None,
              state: str | None = None, page: int = 1, per_page: int = PER_PAGE,
              periods: int = 48, retention_days: float = DEFAULT_RETENTION_DAYS) -> dict:
    """The schedules page: one row per schedule in force, with its strip. A state filter
    (``missing``, ``dead``, ... or ``paused``) looks at every schedule's strip; without one,
    only the shown page's strips are computed."""
    with translate_errors("reading the schedules"), engine.connect() as conn:
        session_snapshot(conn)  # the filter and the strips it lets through read the same rows
        now = session_utc(conn)
        versions = cache.get(conn)
        specs = specs_in_force(versions)
        current = {n: versions[n] for n in specs}
        owners = sorted({s.owner for s in specs.values() if s.owner})
        names = sorted(n for n in specs if not owner or specs[n].owner == owner)
        paused = controls_paused(conn)
        runtime = runtime_live_names(conn)
        if state == "paused":
            names = [n for n in names if n in paused]
        first = (page - 1) * per_page
        strip_state = CellState(state) if state in {s.value for s in CellState} else None
        chosen = names if strip_state else names[first:first + per_page]
        # Each schedule's expected fires; the last N rows all lie at or after the N-th last of
        # them (``start``), so no statement reads the periods before it.
        expected = {n: expected_tail(
            current[n], since=window_start(current[n], now, periods, retention_days,
                                           cache.triggers, cache.lengths),
            until=now, now=now, triggers=cache.triggers, fires=cache.fires, last=periods)
            for n in chosen}
        if strip_state:  # the filter needs every schedule's states, not their drawings
            states = periods_window_states(
                conn, [(n, expected[n].start) for n in chosen], now,
                outcomes=strip_state not in UNRECORDED, jobs=strip_state in JOB_FILTERS)
            wanted = LETTER[strip_state]  # the audit's state letters are the strip's
            names = [n for n in chosen if holds(expected[n], states[n], wanted)]
            shown = names[first:first + per_page]
        else:
            shown = chosen
        windows = [(n, expected[n].start) for n in shown]
        records = periods_windows(conn, windows, now)
        strips: dict[str, Strip] = {
            name: strip_from_rows(name, current[name], strip_rows(
                name, current[name], records_from_rows(records[name]), since=since, now=now,
                periods=periods, triggers=cache.triggers, fires=cache.fires))
            for name, since in windows}
        latest = periods_latest(conn, shown)
        runtimes = attempts_runtimes(conn, shown, SAMPLE)
        conn.rollback()
    rows = []
    for name in shown:
        version = current[name][-1]
        spec = specs[name]
        zone = ZoneInfo(spec.timezone)
        last = latest.get(name)
        upcoming = cache.triggers.get(version.version_id) or spec.trigger()
        nxt = upcoming.next_fire(_next_after(version, last))
        strip = strips[name]
        counts = strip.counts()
        rows.append({
            "name": name, "owner": spec.owner, "description": spec.description,
            "when": describe(spec.resolved_cron, spec.every), "cron": spec.cron or f"every {spec.every:g}s",
            "timezone": spec.timezone, "local_now": now.astimezone(zone).strftime(
                "%Y-%m-%d %H:%M %Z (UTC%z)"),
            "last": None if last is None else {
                "scheduled_for": utc(last[0]), "outcome": last[1], "reason": last[2],
                "job_state": last[4]},
            "next_local": _local(nxt, zone), "next_utc": utc(nxt) if nxt else None,
            "next_relative": relative((nxt - now).total_seconds()) if nxt else None,
            "overdue": bool(nxt and (now - nxt).total_seconds() > spec.grace),
            "paused": name in paused, "strip": strip_svg(strip),
            "source": "runtime" if name in runtime else "file",
            "missing": counts[CellState.MISSING], "dead": counts[CellState.DEAD],
            **runtime_view(runtime_of(name, spec.timeout, runtimes.get(name))),
        })
    return {"now": utc(now), "rows": rows, "owners": owners, "total": len(names),
            "page": page, "pages": max(1, -(-len(names) // per_page)), "periods": periods}


def runtime_view(runtime: Runtime) -> dict[str, Any]:
    """``status``'s run-time fields of a schedule, and its figures in words for the pages."""
    return {"runtime": json_fields(runtime), "runtime_text": figures(runtime)}


def next_fires(version: Version, after: datetime, count: int = 10) -> list[dict]:
    """The next fires, each with the DST note that applies to it (a fixed-time cron's gap or
    fold from ``timing.dst``; for any schedule, a change of UTC offset since the fire before),
    and for a schedule with a calendar, the periods it skips (``calendar``: ``skipped``) and
    the fires ``next_day`` moved (``moved``), with ``calendar_note`` saying which dates."""
    spec = spec_in_force(version)
    trigger = spec.trigger()
    zone = ZoneInfo(spec.timezone)
    fires = list(islice(trigger.fires(after, FAR), count))
    notes = {}
    if fires:
        notes = {a.fires_at: a for a in dst_anomalies(trigger, after, fires[-1])}
    out = []
    previous = after.astimezone(zone).utcoffset()
    for at in fires:
        local = at.astimezone(zone)
        note, kind = None, None
        if at in notes:
            note, kind = notes[at].message, notes[at].kind.value
        elif local.utcoffset() != previous:
            kind = "shift"
            note = (f"the UTC offset changes before this fire ({_offset(previous)} -> "
                    f"{_offset(local.utcoffset())}): a DST transition")
        elif local.fold or local.replace(fold=1).utcoffset() != local.utcoffset():
            kind = "fold"
            note = ("this local time occurs twice (DST fold); an elapsed-time schedule fires at "
                    "each occurrence")
        previous = local.utcoffset()
        mark = calendar_mark(spec, trigger, at)
        out.append({"utc": utc(at), "local": local.isoformat(), "zone": local.tzname(),
                    "kind": kind, "note": note, "calendar": mark.kind if mark else None,
                    "calendar_note": mark.text if mark else None})
    return out


def _offset(delta: timedelta | None) -> str:
    if delta is None:
        return "?"
    minutes = int(delta.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return f"UTC{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def schedule_detail(engine: Any, cache: VersionsCache, name: str, *, periods: int = 48,
                    until: datetime | None = None,
                    retention_days: float = DEFAULT_RETENTION_DAYS) -> dict | None:
    """One schedule: its strip (ending at ``until``, default now), versions with validity,
    next fires; None when the schedule is unknown."""
    with translate_errors("reading the schedule"), engine.connect() as conn:
        now = session_utc(conn)
        versions = cache.get(conn).get(name)
        if not versions:
            conn.rollback()
            return None
        end = min(until, now) if until else now
        since = window_start(versions, end, periods, retention_days, cache.triggers,
                             cache.lengths)
        records = periods_range(conn, name, since, end)
        latest = periods_latest(conn, [name]).get(name)
        paused = name in controls_paused(conn)
        source = "runtime" if runtime_live_among(conn, [name]) else "file"
        found = attempts_runtimes(conn, [name], SAMPLE).get(name)
        conn.rollback()
    strip = build_strip(name, versions, records_from_rows(records), since=since, now=now,
                        until=end, periods=periods, triggers=cache.triggers, fires=cache.fires)
    current = versions[-1]
    listed = []
    for i, v in enumerate(versions):
        until = versions[i + 1].active_from if i + 1 < len(versions) else None
        listed.append({
            "id": v.version_id, "from": utc(v.active_from), "until": utc(until) if until else None,
            "removed": v.spec is None,
            "when": describe(v.spec.resolved_cron, v.spec.every) if v.spec else None,
            "spec": v.spec.to_json() if v.spec else None,
        })
    spec = current.spec
    return {
        "name": name, "now": utc(now), "spec": spec.to_json() if spec else None,
        "when": describe(spec.resolved_cron, spec.every) if spec else None, "paused": paused,
        "source": source,
        "strip": strip_svg(strip), "counts": strip.counts(), "versions": listed[::-1],
        "next": next_fires(current, _next_after(current, latest)) if spec else [],
        **(runtime_view(runtime_of(name, spec.timeout, found)) if spec else
           {"runtime": None, "runtime_text": None}),
    }


def instances(engine: Any, cluster: str, status_doc: dict) -> dict:
    """Every instance (stale ones marked), the leader, and what disagrees."""
    with translate_errors("reading the instances"), engine.connect() as conn:
        session_utc(conn)
        every = instances_all(conn, cluster)
        conn.rollback()
    live = [i for i in every if i["heartbeat_age"] <= LIVE_WITHIN and i["role"] != "stopped"]
    digests = {i["schedules_digest"] for i in live if i["kind"] == "scheduler"}
    tzdata = {i["tzdata_version"] for i in live}
    for i in every:
        i["stopped"] = i["role"] == "stopped"  # stopped gracefully: its heartbeat is its last
        i["stale"] = not i["stopped"] and i["heartbeat_age"] > LIVE_WITHIN
        i["heartbeat_age"] = round(i["heartbeat_age"], 1)
        i["heartbeat_at"] = utc(i["heartbeat_at"])
        i["started_at"] = utc(i["started_at"])
    term = status_doc["leader"]["term"] if status_doc["leader"] else None
    return {"instances": every, "leader": status_doc["leader"], "term": term,
            "last_leader": status_doc["last_leader"], "lock_key": status_doc["lock_key"],
            "digests_disagree": len(digests) > 1, "tzdata_disagree": len(tzdata) > 1,
            "diagnosis": status_doc["diagnosis"]}


def queue(engine: Any, window: float = 300.0) -> dict:
    """The four numbers, from the same statements as the metrics and ``status``: depth by
    state, the oldest ready job's age, the failure rate and attempts per job."""
    with translate_errors("reading the queue"), engine.connect() as conn:
        session_utc(conn)
        depth = dbo.outbox_depth(conn)
        oldest = dbo.outbox_oldest_available(conn)
        retrying = dbo.outbox_retrying(conn)
        failed, finished, failed_before = attempts_recent(conn, window)
        jobs, attempts, most = dbo.outbox_attempts_per_job(conn, window)
        conn.rollback()
    return {
        "depth": {s: depth.get(s, 0) for s in ("available", "running", "succeeded", "dead",
                                               "published")},
        "oldest": sorted(({"schedule": s or None, "owner": o or None,
                           "age_seconds": round(max(age, 0.0), 1), "ready": n}
                          for s, o, age, n in oldest), key=lambda r: -r["age_seconds"]),
        "oldest_age": round(max((max(a, 0.0) for _, _, a, _ in oldest), default=0.0), 1),
        "retrying": [{"schedule": s or None, "owner": o or None, "count": n}
                     for s, o, n in retrying],
        "window_minutes": window / 60, "failed": failed, "finished": finished,
        "failed_before": failed_before,
        "failure_rate": round(failed / finished, 3) if finished else None,
        "jobs_finished": jobs,
        "attempts_per_job": round(attempts / jobs, 2) if jobs else None,
        "most_attempts": most,
    }
