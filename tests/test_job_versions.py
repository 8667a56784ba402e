"""Which output limit a worker gives each job (cronkeeper/worker/job_versions.py), against a
real PostgreSQL: its file spec's; else the version it names, read once per version in one
statement per batch; else ``--output-limit``; and when the database is away, the worker's
limit with a warning rather than an error that would lose the job. The end-to-end case, a
leader and a worker with runtime schedules, is in tests/test_runtime_daemon.py."""

from __future__ import annotations

import json
import logging

import sqlalchemy as sa

from cronkeeper import clock
from cronkeeper.claiming import ClaimingDatabase
from cronkeeper.db.engine import make_engine, normalize_url
from cronkeeper.db.outbox_claims import OutboxJob
from cronkeeper.schedule.model import DEFAULT_OUTPUT_LIMIT
from cronkeeper.schedule.runtime import check_specs
from cronkeeper.worker.job_versions import JobVersions
from cronkeeper.worker.runtime import WorkerConfig

READ = "reading the output limits of schedule versions"


class Counting(ClaimingDatabase):
    """The real database, its statements counted by what they are for."""

    def __init__(self, engine: sa.Engine) -> None:
        super().__init__(engine)
        self.actions: list[str] = []

    def statement(self, action: str):  # type: ignore[override]
        self.actions.append(action)
        return super().statement(action)

    def transaction(self, action: str):  # type: ignore[override]
        self.actions.append(action)
        return super().transaction(action)


def job(n: int, schedule: str | None, version_id: int | None) -> OutboxJob:
    return OutboxJob(id=n, key=f"k{n}", schedule=schedule, scheduled_for=None,
                     version_id=version_id, task="t", payload_json="{}", attempt=1,
                     max_attempts=1, timeout=60.0, backoff_json="{}", serial=False)


def version(engine: sa.Engine, name: str, spec: dict | None) -> int:
    with engine.begin() as conn:
        return conn.exec_driver_sql(
            "INSERT INTO schedule_versions (schedule, digest, spec, active_from, term) VALUES "
            "(%(n)s, 'd', %(s)s, now(), 1) RETURNING id",
            {"n": name, "s": None if spec is None else json.dumps(spec)}).scalar()


def file_spec(name: str, limit: str):
    checked = check_specs({name: {"every": "1h", "timezone": "UTC", "misfire": "skip",
                                  "task": "t", "output_limit": limit}}, now=clock.wall())
    return checked[0].spec


def test_each_job_gets_its_schedules_limit_read_once_per_version(engine):
    zero = version(engine, "tenant-zero", {"output_limit": 0})
    small = version(engine, "tenant-small", {"output_limit": 1000})
    unset = version(engine, "tenant-default", {"task": "t"})  # to_json leaves the default out
    removed = version(engine, "gone", None)
    filed = version(engine, "filed", {"output_limit": 0})  # this worker's file says 100B
    config = WorkerConfig(worker_id="w", output_limit=2048,
                          specs={"filed": file_spec("filed", "100B")})
    db = Counting(engine)
    limits = JobVersions(config, db)
    batch = [job(1, "tenant-zero", zero), job(2, "tenant-small", small),
             job(3, "tenant-default", unset), job(4, "gone", removed), job(5, "filed", filed),
             job(6, None, None), job(7, "tenant-small", small), job(8, "hand-made", 10**9),
             job(9, "filed", None), job(10, "filed", 10**9 + 1)]
    limits.learn(batch)
    assert db.actions.count(READ) == 1
    # The version the job names wins over this worker's file (5: 0, not 100); a job naming
    # no version keeps the file's limit (9), and so does one naming a version that is not
    # there (10); an enqueued job, or one of no known schedule, the worker's (6, 8).
    assert [limits.output_limit(j) for j in batch] == [
        0, 1000, DEFAULT_OUTPUT_LIMIT, DEFAULT_OUTPUT_LIMIT, 0, 2048, 1000, 2048, 100, 100]
    limits.learn(batch)  # every version known: no statement
    limits.learn([job(11, "tenant-zero", zero)])
    assert db.actions.count(READ) == 1
    late = version(engine, "tenant-late", {"output_limit": 4096})
    assert limits.output_limit(job(12, "tenant-late", late)) == 4096  # read by the job itself
    assert db.actions.count(READ) == 2
    assert limits.output_limit(job(13, "filed", 10**9 + 2)) == 100  # not there: its file's
    assert db.actions.count(READ) == 3


def test_with_the_database_away_a_job_keeps_nothing_unless_the_worker_has_its_file(engine,
                                                                                   caplog):
    """A limit that cannot be read is never taken to be larger than the schedule may say: the
    worker's file of the schedule if it has one, else nothing (a schedule may say "0B"
    because its output must not be stored); logged either way, and nothing raises."""
    small = version(engine, "tenant-small", {"output_limit": 1000})
    filed = version(engine, "filed", {"output_limit": 100})
    away = make_engine(normalize_url("postgresql://postgres@127.0.0.1:1/test"), "cronkeeper",
                       pool_size=1)
    config = WorkerConfig(worker_id="w", output_limit=2048,
                          specs={"filed": file_spec("filed", "100B")})
    limits = JobVersions(config, ClaimingDatabase(away))
    one, two = job(1, "tenant-small", small), job(2, "filed", filed)
    limits.learn([one, two])  # does not raise: the claimed jobs still start
    with caplog.at_level(logging.WARNING, logger="cronkeeper.worker"):
        assert limits.output_limit(one) == 0
        assert limits.output_limit(two) == 100
    warned = [r.getMessage() for r in caplog.records
              if getattr(r, "action", None) == "output_limit_unknown"]
    assert len(warned) == 2 and "tenant-small" in warned[0] and "none: not known" in warned[0]
    assert "this worker's file" in warned[1]
    away.dispose()
