"""Process-isolated and async handlers, in real `cronkeeper worker` processes against real
PostgreSQL: a handler stuck where no Python runs is killed at its timeout with everything it
started and its transaction; crashes of each kind are retryable failures naming the crash; a
child that committed and died leaves the job succeeded; children are recycled; async handlers
succeed, fail, dead-letter and are cancelled at their timeout. Tests wait on rows and pids."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from handlers_for_tests import q, wait_until

import cronkeeper

FAST = {"base": 0.1, "factor": 2, "max": 0.5}


@pytest.fixture
def workers(spawned_workers):
    return lambda *args: spawned_workers("--import", "handlers_isolation", "--metrics-address",
                                         "off", "--kill-grace", "0.5", *args)


def add(engine, schema, task, payload=None, key=None, **kw):
    with engine.begin() as conn:
        return cronkeeper.enqueue(conn, task, payload or {}, key=key or f"{task}:{os.urandom(4).hex()}",
                                  schema=schema, **kw)


def state(engine, job):
    return q(engine, "SELECT state FROM outbox WHERE id = %(i)s", i=job)[0][0]


def attempts(engine, job):
    return q(engine, "SELECT attempt, outcome, coalesce(error, '') FROM attempts "
             "WHERE job_id = %(i)s ORDER BY attempt", i=job)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


@pytest.mark.parametrize("how", ["pause", "query"])
def test_stuck_handler_is_killed_with_what_it_started_and_its_transaction(
        engine, schema, runs, workers, tmp_path, how):
    job = add(engine, schema, "iso.stuck", {"dir": str(tmp_path), "how": how}, key="stuck",
              timeout=2.0, max_attempts=3, backoff=FAST)
    proc = workers("--isolation", "process", "--concurrency", "1")
    wait_until(lambda: lines(tmp_path / "pids"), 60, message="the handler started")
    child, grandchild, backend = map(int, lines(tmp_path / "pids"))
    assert child != proc.pid and alive(child) and alive(grandchild)
    wait_until(lambda: state(engine, job) == "succeeded", 60, message="retried to success")
    assert [a[:2] for a in attempts(engine, job)] == [(1, "timeout"), (2, "succeeded")]
    assert "killed" in attempts(engine, job)[0][2]
    wait_until(lambda: not alive(child) and not alive(grandchild), 10, message="pids gone")
    assert q(engine, "SELECT count(*) FROM pg_stat_activity WHERE pid = %(p)s", p=backend) == [(0,)]
    # Attempt 1's effect claim, row and follow-up were rolled back; attempt 2's committed once.
    assert q(engine, "SELECT count(*) FROM runs") == [(1,)]
    assert q(engine, "SELECT count(*) FROM effects WHERE key = 'stuck:stuck'") == [(1,)]
    assert q(engine, "SELECT count(*) FROM outbox WHERE idempotency_key = 'followup:stuck'") == [(1,)]


@pytest.mark.parametrize(("how", "named"), [("segv", "killed by SIGSEGV"),
                                            ("exit3", "exited with status 3"),
                                            ("wait_for_kill", "killed by SIGKILL")])
def test_a_crashed_handler_process_is_a_retryable_failure_naming_it(
        engine, schema, workers, tmp_path, how, named):
    job = add(engine, schema, "iso.crash", {"dir": str(tmp_path), "how": how}, key=f"crash-{how}",
              max_attempts=3, backoff=FAST)
    workers("--isolation", "process", "--concurrency", "1")
    wait_until(lambda: lines(tmp_path / "pids"), 60, message="the handler started")
    if how == "wait_for_kill":  # the OOM killer's way: SIGKILL from outside
        os.kill(int(lines(tmp_path / "pids")[0]), signal.SIGKILL)
    wait_until(lambda: state(engine, job) == "succeeded", 60)
    (first, outcome, error), second = attempts(engine, job)
    assert (first, outcome) == (1, "retry")
    assert named in error, error
    assert second[:2] == (2, "succeeded")
    assert not alive(int(lines(tmp_path / "pids")[0]))


def test_a_child_that_committed_then_died_leaves_the_job_succeeded(engine, schema, runs, workers):
    job = add(engine, schema, "iso.commit_then_die", key="ctd", max_attempts=3, backoff=FAST)
    proc = workers("--isolation", "process", "--concurrency", "1")
    wait_until(lambda: state(engine, job) == "succeeded", 60)
    after = add(engine, schema, "noop", key="after")  # runs once the crash has been handled
    wait_until(lambda: state(engine, after) == "succeeded", 60)
    proc.send_signal(signal.SIGTERM)  # the recorder flushes every ending before exit
    assert proc.wait(30) == 0
    assert "lease lost: jobs=1" in proc.stderr.read()  # the refused failure, logged
    # The worker saw a crash and recorded a failure, which the fence refused: nothing changed.
    assert state(engine, job) == "succeeded"
    assert [a[:2] for a in attempts(engine, job)] == [(1, "succeeded")]
    assert q(engine, "SELECT count(*) FROM runs") == [(1,)]


def test_effect_helper_and_enqueue_in_a_child(engine, schema, runs, workers):
    first = add(engine, schema, "paginate", {"cursor": 1, "last": 3}, key="page:1")
    proc = workers("--isolation", "process", "--concurrency", "2")
    wait_until(lambda: q(engine, "SELECT count(*) FROM outbox WHERE state = 'succeeded'") == [(3,)], 60)
    pids = {r[0] for r in q(engine, "SELECT pid FROM runs")}
    assert proc.pid not in pids
    # Deliver page 1 again: its effect is claimed already, its follow-up exists already.
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE outbox SET state = 'available', run_after = now() "
                             "WHERE id = %(i)s", {"i": first})
    wait_until(lambda: q(engine, "SELECT state, attempts FROM outbox WHERE id = %(i)s", i=first)
               == [("succeeded", 2)], 60)
    assert sorted(r[0] for r in q(engine, "SELECT key FROM runs")) == ["page:1", "page:2", "page:3"]
    assert q(engine, "SELECT count(*) FROM outbox") == [(3,)]


def test_children_are_recycled_after_n_jobs_and_past_the_memory_cap(engine, schema, runs, workers):
    for n in range(5):
        add(engine, schema, "iso.pid", key=f"n{n}")
    add(engine, schema, "iso.pid", {"hold_mib": 96}, key="m0", run_after=3600)
    add(engine, schema, "iso.pid", key="m1", run_after=3600)
    proc = workers("--isolation", "process", "--concurrency", "1", "--max-jobs-per-child", "2",
                   "--max-child-memory", "64")
    wait_until(lambda: q(engine, "SELECT count(*) FROM runs") == [(5,)], 60)
    by_job = [r[0] for r in q(engine, "SELECT r.pid FROM runs r JOIN outbox o "
                                      "ON o.idempotency_key = r.key ORDER BY o.id")]
    assert proc.pid not in by_job
    assert [by_job.count(p) for p in dict.fromkeys(by_job)] == [2, 2, 1], by_job
    with engine.begin() as conn:  # now the memory cap: 96 MiB held by m0's process
        conn.exec_driver_sql("UPDATE outbox SET run_after = now() WHERE idempotency_key IN ('m0', 'm1')")
    wait_until(lambda: q(engine, "SELECT count(*) FROM runs") == [(7,)], 60)
    m0, m1 = (q(engine, "SELECT pid FROM runs WHERE key = %(k)s", k=k)[0][0] for k in ("m0", "m1"))
    assert m0 != m1


def test_sigterm_releases_a_running_handler_and_leaves_no_process(
        engine, schema, runs, workers, tmp_path):
    job = add(engine, schema, "iso.stuck", {"dir": str(tmp_path)}, key="drained", timeout=60)
    proc = workers("--isolation", "process", "--concurrency", "2", "--drain-timeout", "1")
    wait_until(lambda: lines(tmp_path / "pids"), 60, message="the handler started")
    child, grandchild, _ = map(int, lines(tmp_path / "pids"))
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert [a[:2] for a in attempts(engine, job)] == [(1, "released")]
    assert q(engine, "SELECT state, leased_by FROM outbox WHERE id = %(i)s", i=job) == [("available", None)]
    wait_until(lambda: not alive(child) and not alive(grandchild), 10, message="pids gone")
    assert q(engine, "SELECT count(*) FROM outbox WHERE idempotency_key = 'followup:drained'") == [(0,)]


def test_a_killed_worker_takes_its_handler_processes_with_it(engine, schema, runs, workers):
    add(engine, schema, "iso.pid", key="one")
    proc = workers("--isolation", "process", "--concurrency", "2")
    wait_until(lambda: q(engine, "SELECT pid FROM runs"), 60)
    child = q(engine, "SELECT pid FROM runs")[0][0]
    assert alive(child)
    proc.kill()
    proc.wait(10)
    wait_until(lambda: not alive(child), 10, message="handler process gone with its worker")


def test_a_task_marked_process_runs_in_a_child_on_a_thread_worker(engine, schema, runs, workers):
    job = add(engine, schema, "iso.forced_process", key="forced")
    proc = workers("--concurrency", "2")
    wait_until(lambda: state(engine, job) == "succeeded", 60)
    assert q(engine, "SELECT pid FROM runs")[0][0] != proc.pid


def test_handler_processes_outlive_the_threads_that_first_needed_them(
        engine, schema, runs, workers, tmp_path):
    """A runner thread abandoned by a timed-out sync handler ends; the child processes must
    live on for the next jobs (PR_SET_PDEATHSIG fires at the death of the *starting thread*,
    so children are started by one long-lived thread, never by a runner)."""
    before = [add(engine, schema, "iso.forced_process", {"sleep": 0.5}, key=f"before{n}")
              for n in range(3)]
    proc = workers("--concurrency", "3")  # three runners, each takes a child at once
    wait_until(lambda: [state(engine, j) for j in before] == ["succeeded"] * 3, 60)
    stuck = add(engine, schema, "iso.overstay", {"dir": str(tmp_path), "sleep": 1.5}, key="overstay",
                timeout=0.5, max_attempts=1)
    wait_until(lambda: lines(tmp_path / "woke"), 60, message="the abandoned thread returned")
    assert [a[:2] for a in attempts(engine, stuck)] == [(1, "timeout")]
    after = [add(engine, schema, "iso.forced_process", {"sleep": 0.5}, key=f"after{n}")
             for n in range(3)]
    wait_until(lambda: [state(engine, j) for j in after] == ["succeeded"] * 3, 60)
    assert [[a[:2] for a in attempts(engine, j)] for j in after] == [[(1, "succeeded")]] * 3
    pid_of = dict(q(engine, "SELECT key, pid FROM runs"))
    before_pids = {pid_of[f"before{n}"] for n in range(3)}
    assert {pid_of[f"after{n}"] for n in range(3)} <= before_pids  # the same children
    assert proc.pid not in before_pids


# -- async handlers -------------------------------------------------------------------------------

@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_async_handlers_succeed_fail_and_dead_letter(engine, schema, runs, workers, isolation):
    ok = add(engine, schema, "iso.async_ok", {"follow": True}, key="aok")
    flaky = add(engine, schema, "iso.async_fails", key="aflaky", max_attempts=2, backoff=FAST)
    perm = add(engine, schema, "iso.async_permanent", key="aperm")
    workers("--isolation", isolation, "--concurrency", "2")
    wait_until(lambda: [state(engine, j) for j in (ok, flaky, perm)] == ["succeeded", "dead", "dead"], 60)
    assert q(engine, "SELECT key FROM runs") == [("aok",)]
    assert q(engine, "SELECT count(*) FROM outbox WHERE idempotency_key = 'followup:aok'") == [(1,)]
    assert [a[:2] for a in attempts(engine, flaky)] == [(1, "retry"), (2, "dead")]
    assert "FlakyAsync: upstream 503" in attempts(engine, flaky)[1][2]
    assert [a[:2] for a in attempts(engine, perm)] == [(1, "dead")]
    assert "order 7 does not exist" in attempts(engine, perm)[0][2]


def test_async_jobs_on_one_runner_reuse_its_connection(engine, schema, runs, workers):
    jobs = [add(engine, schema, "iso.async_backend", key=f"ab{n}") for n in range(3)]
    workers("--concurrency", "1")
    wait_until(lambda: [state(engine, j) for j in jobs] == ["succeeded"] * 3, 60)
    assert len({pid for (pid,) in q(engine, "SELECT pid FROM runs")}) == 1
    assert q(engine, "SELECT count(*) FROM runs") == [(3,)]


def test_async_timeout_cancels_the_coroutine_and_its_tasks(engine, schema, workers, tmp_path):
    job = add(engine, schema, "iso.async_hangs", {"dir": str(tmp_path)}, key="hang", timeout=1.0,
              max_attempts=3, backoff=FAST)
    workers("--concurrency", "1")
    wait_until(lambda: any(a[1] == "timeout" for a in attempts(engine, job)), 60)
    ticks = len(lines(tmp_path / "ticks"))
    assert ticks > 0
    assert sorted(lines(tmp_path / "cancelled")) == ["handler", "ticker"]
    assert "coroutine cancelled" in attempts(engine, job)[0][2]
    wait_until(lambda: state(engine, job) == "succeeded", 60)
    assert [a[:2] for a in attempts(engine, job)] == [(1, "timeout"), (2, "succeeded")]
    # The follow-up enqueued by attempt 1 was rolled back; nothing of attempt 1 ran afterwards.
    assert q(engine, "SELECT count(*) FROM outbox WHERE idempotency_key = 'followup:hang'") == [(0,)]
    assert len(lines(tmp_path / "ticks")) == ticks


def test_testing_runs_async_handlers_twice_and_classifies_them(engine, schema, runs):
    import handlers_isolation as h

    from cronkeeper import testing

    def count() -> int:
        return q(engine, "SELECT count(*) FROM runs")[0][0]

    testing.assert_runs_once(h.async_ok, {}, engine=engine, schema=schema, count=count)
    testing.assert_runs_once(h.async_ok, {}, engine=engine, schema=schema, count=count,
                             key="other@2026-01-01T00:00:00Z", concurrently=True)
    assert count() == 2
    assert testing.classify(h.async_fails, {}).retryable
    assert testing.classify(h.async_permanent, {}).permanent


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_jobs_committed_by_their_handler_are_counted_as_finished(
        engine, schema, runs, workers, isolation):
    """The recorder never sees a job whose handler's transaction committed the completion:
    its ending is counted where it is committed (the running gauge comes back to zero)."""
    from test_metrics_worker import _free_port, _scrape

    port = _free_port()
    jobs = [add(engine, schema, "count", key=f"m{n}") for n in range(3)]
    workers("--isolation", isolation, "--concurrency", "2", "--metrics-address", f"127.0.0.1:{port}")
    wait_until(lambda: [state(engine, j) for j in jobs] == ["succeeded"] * 3, 60)
    values = wait_until(lambda: (lambda v: v if v.get(
        'cronkeeper_jobs_finished_total{outcome="succeeded",owner="",schedule=""}') == 3
        else None)(_scrape(port)), 15, message="three successes reported")
    assert values["cronkeeper_jobs_running"] == 0
