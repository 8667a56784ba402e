"""Everything ``cronkeeper status`` shows, as one document read in one transaction, and the
diagnosis in words (the web's ``/api/status`` and its pages use the same document)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from cronkeeper.runtimes import SAMPLE, Runtime, advice, figures, json_fields
from cronkeeper.schedule.diagnostics import safe

STORM_WINDOW = 300.0  # seconds of attempts the retry-storm check looks at
STOPPED_WITHIN = 3600.0  # instances that stopped gracefully this recently are listed as stopped
STORM_MIN_FAILURES = 5
SKEW_WARN = 1.0  # seconds an instance's clock may be off the database's before status says so


def _iso(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return value


def gather(engine, schema: str, cluster: str, *, leader_timeout: float = 10.0,
           live_within: float = 30.0, schedules_path: str | None = None,
           use_summary: bool = True) -> dict[str, Any]:
    """Everything status shows, read in one transaction, plus the diagnosis. ``schedules_path``
    (the schedule files, optional) is read only to place the ``timeout`` of a schedule near
    it. Each schedule's figures come from the leader's summary where it may be used
    (``operations.figures``; ``use_summary`` False: all computed live)."""
    from cronkeeper.db import outbox as dbo
    from cronkeeper.db.attempts import attempts_recent
    from cronkeeper.db.engine import leader_lock_key, translate_errors
    from cronkeeper.db.instances import instances_live, instances_stopped_recently
    from cronkeeper.db.leadership import leadership_current, lock_holder_pid
    from cronkeeper.db.relay_routes import relay_routes_list
    from cronkeeper.db.runtime_schedules import runtime_live_names
    from cronkeeper.db.schedule_controls import controls_paused
    from cronkeeper.db.schedule_versions import versions_heads
    from cronkeeper.db.sessions import session_jit_off, session_utc
    from cronkeeper.operations.figures import gather_figures, heads_in_force, periods_of
    from cronkeeper.operations.leadership import leads

    key = leader_lock_key(schema, cluster)
    pool = ThreadPoolExecutor(2, thread_name_prefix="status-reads")
    with pool, translate_errors("reading the cluster's status"), engine.connect() as conn:
        now = session_utc(conn)
        # JIT off: the statements are index scans per schedule, which the planner (blind to how
        # many names an unnest holds) costs past jit_above_cost; compiling took a second.
        session_jit_off(conn)
        lead = leadership_current(conn, cluster)
        instances = instances_live(conn, cluster, live_within)
        stopped = instances_stopped_recently(conn, cluster, STOPPED_WITHIN)
        held = lock_holder_pid(conn, key) is not None
        heads = versions_heads(conn)
        current = heads_in_force(heads)
        # The statements that read a row per schedule or per job (each schedule's latest
        # period, the outbox by state) run on a connection of their own meanwhile.
        aside = pool.submit(side_read, engine, list(current))
        paused = controls_paused(conn)
        runtime_names = runtime_live_names(conn)
        oldest = dbo.outbox_oldest_available(conn)
        dead = dbo.outbox_dead(conn)
        failed, finished, failed_before = attempts_recent(conn, STORM_WINDOW)
        routes = relay_routes_list(conn)
        # The run-time figures of schedules computed live are the heaviest statement (up to
        # 100 attempts a schedule): read on a connection of their own too.
        gathered = gather_figures(
            conn, now, heads, lambda: aside.result()[0],
            summaries=use_summary and leads(lead, leader_timeout),
            read_runtimes=lambda names: pool.submit(runtimes_read, engine, names))
        latest, depth = aside.result()
        periods = periods_of(conn, [s for s, _o, _a, _n in oldest], now, gathered.figures)
        conn.rollback()

    leader = None
    if lead and leads(lead, leader_timeout):
        leader = {"instance_id": lead["instance_id"], "term": lead["term"],
                  "since": _iso(lead["since"]), "heartbeat_at": _iso(lead["heartbeat_at"])}
    schedules = []
    runtimes: dict[str, Runtime] = {}
    for name, got in gathered.figures.items():
        runtime = runtimes[name] = got.runtime
        last = latest.get(name)
        upcoming = got.next_fire
        schedules.append({
            "name": name,
            "source": "runtime" if name in runtime_names else "file",
            "owner": got.owner,
            "next_fire": _iso(upcoming),
            "overdue": bool(upcoming and (now - upcoming).total_seconds() > got.grace),
            "last_outcome": None if last is None else {
                "scheduled_for": _iso(last[0]), "outcome": last[1], "reason": last[2],
                "decided_at": _iso(last[3]), "job_state": last[4],
            },
            "paused": name in paused,
            **json_fields(runtime),
        })
    doc: dict[str, Any] = {
        "cluster": cluster,
        "schema": schema,
        "database": None,
        "now": _iso(now),
        "lock_key": key,
        "lock_held": held,
        "leader": leader,
        "last_leader": None if lead is None else {
            "instance_id": lead["instance_id"], "term": lead["term"], "since": _iso(lead["since"]),
            "heartbeat_age_seconds": round(lead["heartbeat_age"], 3),
            "released_at": _iso(lead["released_at"]),
        },
        "instances": [
            {"instance_id": i["instance_id"], "kind": i["kind"], "role": i["role"],
             "host": i["host"], "pid": i["pid"], "version": i["version"],
             "schedules_digest": i["schedules_digest"], "tzdata_version": i["tzdata_version"],
             "heartbeat_at": _iso(i["heartbeat_at"]), "clock_skew_seconds": i["clock_skew_seconds"]}
            for i in instances
        ],
        "stopped_instances": [
            {"instance_id": i["instance_id"], "kind": i["kind"], "host": i["host"],
             "version": i["version"], "stopped_at": _iso(i["heartbeat_at"])}
            for i in stopped
        ],
        "schedules": schedules,
        "queue": {
            "depth": {s: depth.get(s, 0) for s in ("available", "running", "succeeded", "dead",
                                                    "published")},
            "oldest_available": [
                {"schedule": s or None, "owner": o or None, "age_seconds": round(age, 3),
                 "ready": n} for s, o, age, n in oldest
            ],
            "dead_letters": [{"schedule": s or None, "owner": o or None, "count": n}
                             for s, o, n in dead],
            "attempts_failed_recent": failed,
            "attempts_finished_recent": finished,
            "attempts_failed_before": failed_before,
        },
        "periods_missing_last_hour": dict(sorted(gathered.missing.items())),
        # where the figures came from (the leader's summary, or computed live) and how old
        "figures": {k: _iso(v) for k, v in gathered.source().items()},
        # docs/relay.md: jobs these routes match go to a relay; workers never claim them
        "relay_routes": [{"relay": r, "position": p, "target": t, "tasks": ts, "schedules": ss}
                         for r, p, t, ts, ss in routes],
    }
    near = [r for r in runtimes.values() if r.near]
    where = timeout_places(schedules_path, {r.schedule for r in near}) if near else {}
    doc["diagnosis"] = gathered.problems + diagnose(doc, periods, runtimes, where)
    return doc


def side_read(engine: Any, names: list[str]) -> tuple[dict[str, tuple], dict[str, int]]:
    """Each schedule's latest decided period, and the outbox's jobs by state, in a
    transaction of their own (JIT off, as above)."""
    from cronkeeper.db.engine import translate_errors
    from cronkeeper.db.outbox import outbox_depth
    from cronkeeper.db.periods import periods_latest
    from cronkeeper.db.sessions import session_jit_off

    with translate_errors("reading the cluster's status"), engine.connect() as conn:
        session_jit_off(conn)
        latest = periods_latest(conn, names)
        depth = outbox_depth(conn)
        conn.rollback()
    return latest, depth


def runtimes_read(engine: Any, names: list[str]
                  ) -> dict[str, tuple[int, float | None, float | None, int]]:
    """``attempts_runtimes`` for ``names`` in a transaction of its own (JIT off, as above)."""
    from cronkeeper.db.attempts import attempts_runtimes
    from cronkeeper.db.engine import translate_errors
    from cronkeeper.db.sessions import session_jit_off

    with translate_errors("reading the schedules' run times"), engine.connect() as conn:
        session_jit_off(conn)
        figures_of = attempts_runtimes(conn, names, SAMPLE)
        conn.rollback()
    return figures_of


def timeout_places(path: str | None, names: set[str]) -> dict[str, str]:
    """Where each schedule of ``names`` sets ``timeout``, as words for the advice: ``file:line``
    of its ``timeout`` key, or of its table when it sets none (the default, 10 minutes, then
    applies). The stored versions do not say which file a schedule came from, so without the
    schedule files (``--schedules``, env CRONKEEPER_SCHEDULES) the words say where to look."""
    if not path:
        return {n: "in its schedule file; `cronkeeper status --schedules DIR` names the file "
                   "and line" for n in names}
    from pathlib import Path

    from cronkeeper import clock
    from cronkeeper.schedule import load_paths
    from cronkeeper.schedule.lines import LineIndex

    found: dict[str, str] = {}
    indexes: dict[str, LineIndex | None] = {}
    for spec in load_paths([path], now=clock.wall(), keep_warnings=False).schedules.specs:
        if spec.name not in names:
            continue
        if spec.file not in indexes:
            try:
                indexes[spec.file] = LineIndex(Path(spec.file).read_text(encoding="utf-8-sig"))
            except (OSError, UnicodeDecodeError):
                indexes[spec.file] = None
        index = indexes[spec.file]
        header = index.line(spec.name) if index else spec.line
        line = index.line(spec.name, "timeout") if index else header
        found[spec.name] = (f"at {spec.file}:{line}" if line != header else
                            f"add it to [{spec.name}] at {spec.file}:{header}; it sets none")
    for name in names - found.keys():
        found[name] = f"not found in {path}: in the schedule file that defines it"
    return found


def dumps(doc: dict[str, Any]) -> str:
    """``status --format json``: the web's ``/api/status`` is the same text. Encoded by orjson:
    at 10,000 schedules the document is 8.5 MB, and the standard library's encoder, in pure
    Python as soon as it indents, took 0.3 s of status's second; same JSON, non-ASCII text
    as UTF-8 rather than escaped, anything else (a raw datetime) as ``str``."""
    import orjson

    return orjson.dumps(doc, default=str, option=orjson.OPT_INDENT_2
                        | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS).decode()


def diagnose(doc: dict[str, Any], periods: dict[str, float | None],
             runtimes: dict[str, Runtime] | None = None,
             where: dict[str, str] | None = None) -> list[str]:
    """What is wrong, in words, from the gathered facts (pure). ``where``: the words saying
    where a schedule near its timeout sets it (``timeout_places``)."""
    out: list[str] = []
    schedulers = [i for i in doc["instances"] if i["kind"] == "scheduler"]
    owners = {s["name"]: s["owner"] for s in doc["schedules"]}

    def who(schedule: str | None, owner: str | None = None) -> str:
        owner = owner or owners.get(schedule or "")
        return f"{schedule or '(enqueued by an application)'}" + (f" (owner {owner})" if owner else "")

    if doc["leader"] is None:
        last = doc["last_leader"]
        if not schedulers:
            why = "no scheduler instance is running (start `cronkeeper run` on your VMs)"
        elif last and last["released_at"]:
            why = (f"{last['instance_id']} released leadership at {last['released_at']} and no "
                   "live instance has taken it")
        elif last:
            why = (f"the last leader {last['instance_id']} (term {last['term']}) has not "
                   f"heartbeated for {last['heartbeat_age_seconds']:.0f}s: frozen, stalled or "
                   "cut off; a standby deposes it")
        else:
            why = "no instance has ever led this cluster"
        out.append(f"no leader: {why}. Nothing fires until one leads.")
    releases = sorted({i["version"] for i in doc["instances"]})
    if len(releases) > 1:
        groups = "; ".join(f"{safe(r)}: " + " ".join(safe(i["instance_id"]) for i in doc["instances"]
                                                  if i["version"] == r) for r in releases)
        out.append(f"live instances run different releases ({groups}): a rolling upgrade is under "
                   "way; finish it, one instance at a time (docs/upgrading.md)")
    digests = {i["schedules_digest"] for i in schedulers}
    if len(digests) > 1:
        groups = ", ".join(
            f"{d[:12]}: " + " ".join(i["instance_id"] for i in schedulers
                                     if i["schedules_digest"] == d) for d in sorted(digests))
        out.append(f"schedule digest disagreement among live schedulers ({groups}): deploy the "
                   "same schedule files everywhere; the leader's set is the one that fires")
    tz = {i["tzdata_version"] for i in doc["instances"]}
    if len(tz) > 1:
        out.append(f"tzdata disagreement among live instances ({', '.join(sorted(tz))}): two "
                   "versions can place a DST transition differently; upgrade the older hosts")
    for i in doc["instances"]:
        skew = i["clock_skew_seconds"]
        if skew is not None and abs(skew) > SKEW_WARN:
            out.append(f"clock skew: {i['instance_id']} ({i['kind']}) is {abs(skew):.1f}s "
                       f"{'behind' if skew > 0 else 'ahead of'} the database's clock. Nothing "
                       "fires or times out by it (the database's clock rules), but its logs "
                       "and its own timestamps are off: check NTP on that host")
    q = doc["queue"]
    worst = max((o["age_seconds"] for o in q["oldest_available"]), default=0.0)
    failed, finished = q["attempts_failed_recent"], q["attempts_finished_recent"]
    if (failed >= STORM_MIN_FAILURES and failed >= q["attempts_failed_before"]
            and failed >= finished / 2 and worst > 60):
        out.append(
            f"retry storm: {failed} of {finished} attempts failed in the last "
            f"{STORM_WINDOW / 60:.0f} minutes (not fewer than before) while the oldest ready job "
            f"has waited {worst:.0f}s. Adding workers makes this worse: it retries the failing "
            "dependency harder. Fix or pause the failing dependency first.")
    for o in q["oldest_available"]:
        period = periods.get(o["schedule"] or "")
        if period and o["age_seconds"] > period:
            out.append(
                f"queue behind: the oldest ready job of {who(o['schedule'], o['owner'])} has "
                f"waited {o['age_seconds']:.0f}s, longer than its period ({period:.0f}s): "
                "workers are not keeping up or not claiming it")
    for d in q["dead_letters"]:
        out.append(f"dead letters waiting: {d['count']} of {who(d['schedule'], d['owner'])}: "
                   "`cronkeeper dlq list` to inspect, then replay or discard")
    for name, n in sorted(doc["periods_missing_last_hour"].items()):
        out.append(f"periods missing: {n} period(s) of {who(name)} in the last hour have no "
                   "recorded outcome (`cronkeeper history " + name + " --since 1h`)")
    for name, runtime in sorted((runtimes or {}).items()):
        if runtime.near:
            out.append(f"runtime near timeout: {who(name)}: {figures(runtime)}. "
                       f"{advice(runtime, (where or {}).get(name))}")
    return out
