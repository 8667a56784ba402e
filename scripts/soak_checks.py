"""The invariants ``scripts/soak.py`` checks at the end, from the database and from the
handlers' own records (``soak_effects``, written in each job's transaction, and the run log
files). Each check returns (ok, detail); the detail says what was counted, so a PASS is
visibly not vacuous."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psycopg
from daemon_harness import CRONKEEPER, audit


@dataclass(frozen=True, slots=True)
class Result:
    name: str
    ok: bool
    detail: str


def _iso(t: datetime) -> str:
    return t.astimezone().strftime("%Y-%m-%dT%H:%M:%S.%f%z")


def check_periods(db: psycopg.Connection, until: datetime) -> list[Result]:
    a = audit(db, until=until)
    one_outcome = not (a.missing or a.unexpected)
    two_jobs = a.duplicate_jobs + a.bad_keys + a.emitted_without_job + a.job_without_emitted
    by_outcome = dict(db.execute(
        "SELECT coalesce(outcome || ':' || reason, outcome), count(*) FROM periods"
        " WHERE scheduled_for <= %s GROUP BY 1 ORDER BY 1", (until,)).fetchall())
    return [
        Result("every period has exactly one outcome", one_outcome,
               f"{sum(by_outcome.values())} periods due: {by_outcome}; missing {a.missing[:5]}, "
               f"outcome for no period of the spec {a.unexpected[:5]}"),
        Result("no period produced two jobs", not two_jobs,
               f"{a.jobs} scheduled jobs; two jobs for one period {a.duplicate_jobs[:5]}, "
               f"bad keys {a.bad_keys[:5]}, emitted without job {a.emitted_without_job[:5]}, "
               f"job without emitted period {a.job_without_emitted[:5]}"),
    ]


def check_history(url: str, schema: str, since: datetime, until: datetime) -> Result:
    proc = subprocess.run(
        [CRONKEEPER, "history", "--database-url", url, "--schema", schema, "--since", _iso(since),
         "--until", _iso(until), "--format", "json"], capture_output=True, text=True, timeout=120)
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        return Result("history reports nothing missing", False,
                      f"exit {proc.returncode}, not JSON: {proc.stderr.strip()[-300:]}")
    missing = [(r["schedule"], r["scheduled_for"]) for r in doc["periods"] if r["status"] == "missing"]
    totals = {k: sum(s[k] for s in doc["summary"]) for k in ("emitted", "skipped", "pending", "missing")}
    return Result("history reports nothing missing", proc.returncode == 0 and not missing,
                  f"exit {proc.returncode}; {totals}; missing {missing[:5]}")


def check_jobs(db: psycopg.Connection) -> Result:
    states = dict(db.execute("SELECT state, count(*) FROM outbox GROUP BY 1").fetchall())
    unfinished = db.execute(
        "SELECT idempotency_key, state, attempts, last_error FROM outbox"
        " WHERE state NOT IN ('succeeded', 'dead') ORDER BY id LIMIT 5").fetchall()
    dead_silent = db.execute(
        "SELECT idempotency_key FROM outbox WHERE state = 'dead'"
        " AND coalesce(last_error, '') = ''").fetchall()
    orders_without_job = db.execute(
        "SELECT o.key FROM app_orders o LEFT JOIN outbox j ON j.idempotency_key = o.key"
        " WHERE j.id IS NULL").fetchall()
    jobs_without_order = db.execute(
        "SELECT j.idempotency_key FROM outbox j LEFT JOIN app_orders o ON o.key = j.idempotency_key"
        " WHERE j.idempotency_key LIKE 'app:%%' AND j.idempotency_key NOT LIKE '%%/%%'"
        " AND o.key IS NULL").fetchall()
    # ctx.enqueue: a follow-up exists iff its parent completed.
    orphans = db.execute(
        "SELECT c.idempotency_key FROM outbox c LEFT JOIN outbox p"
        " ON p.idempotency_key = regexp_replace(c.idempotency_key, '/[0-9]+$', '')"
        " WHERE c.idempotency_key ~ '/[0-9]+$' AND p.state IS DISTINCT FROM 'succeeded'").fetchall()
    unchained = db.execute(
        "SELECT p.idempotency_key FROM outbox p LEFT JOIN outbox c"
        " ON c.idempotency_key = p.idempotency_key || '/' || (p.payload->>'chain')"
        " WHERE p.state = 'succeeded' AND (p.payload->>'chain')::int > 0 AND c.id IS NULL").fetchall()
    reasons = dict(db.execute(
        "SELECT split_part(last_error, ':', 1), count(*) FROM outbox WHERE state = 'dead'"
        " GROUP BY 1 ORDER BY 2 DESC").fetchall())
    orders = db.execute("SELECT count(*) FROM app_orders").fetchone()[0]
    chained = db.execute("SELECT count(*) FROM outbox WHERE idempotency_key ~ '/[0-9]+$'").fetchone()[0]
    ok = not (unfinished or dead_silent or orders_without_job or jobs_without_order or orphans
              or unchained)
    return Result("every emitted or enqueued job ended succeeded or dead with a reason", ok,
                  f"jobs by state {states}; {orders} enqueued by the application "
                  f"(order without job {orders_without_job[:3]}, job without order "
                  f"{jobs_without_order[:3]}), {chained} follow-ups (without a completed parent "
                  f"{orphans[:3]}, completed parent without follow-up {unchained[:3]}); "
                  f"unfinished {unfinished}; dead letters by reason {reasons}; dead without a "
                  f"reason {dead_silent[:3]}")


def check_effects(db: psycopg.Connection, run_logs: Path) -> Result:
    twice = db.execute("SELECT job_key, count(*) FROM soak_effects GROUP BY 1 HAVING count(*) > 1"
                       " LIMIT 5").fetchall()
    succeeded_without = db.execute(
        "SELECT j.idempotency_key FROM outbox j LEFT JOIN soak_effects e ON e.job_key = j.idempotency_key"
        " WHERE j.state = 'succeeded' AND e.job_key IS NULL LIMIT 5").fetchall()
    effect_not_succeeded = db.execute(
        "SELECT e.job_key, j.state FROM soak_effects e LEFT JOIN outbox j ON j.idempotency_key = e.job_key"
        " WHERE j.state IS DISTINCT FROM 'succeeded' LIMIT 5").fetchall()
    effects = db.execute("SELECT count(*) FROM soak_effects").fetchone()[0]
    runs: dict[str, int] = {}
    for path in run_logs.glob("runs-*.log"):
        for line in path.read_text().splitlines():
            key = line.split("\t", 1)[0]
            runs[key] = runs.get(key, 0) + 1
    reruns = sum(n - 1 for n in runs.values() if n > 1)
    ok = not (twice or succeeded_without or effect_not_succeeded)
    return Result("no job's effect happened twice", ok,
                  f"{sum(runs.values())} handler runs for {len(runs)} jobs ({reruns} re-runs, "
                  f"absorbed or retried), {effects} effects; twice {twice}, succeeded without "
                  f"effect {succeeded_without}, effect of a job not succeeded {effect_not_succeeded}")


def check_fence(db: psycopg.Connection, worker_logs: list[Path]) -> Result:
    """A completion is a row of ``soak_completions``, written by the handler in the job's
    transaction, which the worker commits together with the fenced UPDATE that marks the job
    succeeded; it names the worker and the attempt that ran it. Each succeeded job must have
    exactly one, from its last attempt, claimed by that worker and recorded as the one that
    succeeded; a dead job none. An attempt that lost its lease (reaped as lease_expired, or
    superseded by a later claim) must have committed nothing."""
    bad = db.execute(
        """
        SELECT c.job_key, c.worker_id, c.attempt, j.state, j.attempts, a.worker_id, a.outcome
        FROM soak_completions c LEFT JOIN outbox j ON j.idempotency_key = c.job_key
        LEFT JOIN attempts a ON a.job_id = j.id AND a.attempt = c.attempt
        WHERE j.id IS NULL OR j.state <> 'succeeded' OR a.id IS NULL OR a.worker_id <> c.worker_id
           OR a.outcome IS DISTINCT FROM 'succeeded' OR c.attempt <> j.attempts
        LIMIT 5
        """).fetchall()
    counts = db.execute(
        """
        SELECT j.idempotency_key, count(c.job_key) FROM outbox j
        LEFT JOIN soak_completions c ON c.job_key = j.idempotency_key
        WHERE j.state = 'succeeded' GROUP BY 1 HAVING count(c.job_key) <> 1 LIMIT 5
        """).fetchall()
    double = db.execute(
        "SELECT job_id, count(*) FROM attempts WHERE outcome = 'succeeded' GROUP BY 1"
        " HAVING count(*) > 1 LIMIT 5").fetchall()
    completions = db.execute("SELECT count(*) FROM soak_completions").fetchone()[0]
    expired = db.execute("SELECT count(*) FROM attempts WHERE outcome = 'lease_expired'").fetchone()[0]
    expired_then_done = db.execute(
        "SELECT count(DISTINCT a.job_id) FROM attempts a JOIN outbox j ON j.id = a.job_id"
        " WHERE a.outcome = 'lease_expired' AND j.state = 'succeeded'").fetchone()[0]
    refused = 0
    for path in worker_logs:
        if path.exists():
            for line in path.read_text().splitlines():
                if '"lease_lost"' in line:
                    refused += 1
    ok = not (bad or counts or double)
    return Result("no completion recorded by a worker that had lost its lease", ok,
                  f"{completions} completions committed; {expired} attempts lost their lease "
                  f"(reaped), {expired_then_done} of those jobs later completed by a newer attempt; "
                  f"{refused} lease losses logged by workers (lease_lost); completions not by the "
                  f"succeeding attempt {bad}, succeeded jobs without exactly one completion "
                  f"{counts}, jobs with two succeeded attempts {double}")


def check_processes(logs: list[Path]) -> Result:
    """No cronkeeper process died of its own accord or printed a traceback."""
    found = []
    for path in logs:
        if path.exists():
            text = path.read_text()
            if "Traceback" in text or '"internal_error"' in text:
                idx = max(text.find("Traceback"), text.find('"internal_error"'))
                found.append(f"{path.name}: {text[idx:idx + 300]!r}")
    return Result("no traceback or internal error in any daemon or worker log", not found,
                  f"{len(logs)} logs read; {found[:3]}")
