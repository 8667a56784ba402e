"""What the worker knows of the schedule versions its jobs name, read once per version (a
version never changes): the output limit of each task job's version, and the digest of those
its command jobs ran (``execute.run_command``).

How much output an attempt of each job keeps: its schedule's ``output_limit`` (SPEC §16),
wherever the schedule is defined.

- A job the leader emitted (``outbox.version_id``): the limit in the spec of that version,
  file or runtime schedule alike, whatever this worker's own files say now (they may be a
  deploy behind or ahead). Read from ``schedule_versions`` once per version, as a version
  never changes: one statement for the versions a claimed batch names that are not known yet
  (none once they are), made by the claim loop before the jobs start.
- A job that names no version but a schedule of this worker's files: that spec's limit.
- A job without either (``cronkeeper.enqueue``): the worker's ``--output-limit``.

If that statement fails (the database went away just after the claim), each such job reads
its version when it starts; if that fails too, it keeps what this worker's file of the
schedule says, or nothing (logged): a schedule may say ``"0B"`` because its output must not
be stored, so a limit that cannot be read is never taken to be larger.
"""

from __future__ import annotations

import logging

from cronkeeper.claiming import ClaimingDatabase
from cronkeeper.db.outbox_claims import OutboxJob
from cronkeeper.db.schedule_versions import versions_output_limits
from cronkeeper.errors import DatabaseError
from cronkeeper.schedule.model import DEFAULT_OUTPUT_LIMIT
from cronkeeper.worker.runtime import WorkerConfig

log = logging.getLogger("cronkeeper.worker")

# Versions remembered (each way) before the memory is cleared and read again: many runtime
# schedules changing often must not grow a long-lived worker without bound.
REMEMBERED = 100_000
_ABSENT = -1  # remembered for a version that is not there (a row written by hand)


class JobVersions:
    """The output limit of each job this worker runs, and the digests of the versions its
    command jobs ran (module docstring). ``learn`` runs on the claim loop's thread,
    ``output_limit`` on the runners': a dict's get and update are each atomic."""

    def __init__(self, config: WorkerConfig, db: ClaimingDatabase) -> None:
        self._config = config
        self._db = db
        self._by_version: dict[int, int] = {}  # output limits
        self.digests: dict[int, str] = {}  # of the versions command jobs named

    def learn(self, jobs: list[OutboxJob], *, kept: bool = True) -> None:
        """Read the limits of the versions these jobs name that are not known yet (one
        statement; none when every one is known). A failure leaves them to ``output_limit``.
        ``kept``: on the claim loop's kept connection; a runner thread (``output_limit``) takes
        one from the pool and gives it back (a connection kept by every runner would empty
        the pool)."""
        unknown = {job.version_id for job in jobs
                   if job.version_id is not None and self._needs_version(job)}
        if not unknown:
            return
        action = "reading the output limits of schedule versions"
        try:
            with self._db.statement(action) if kept else self._db.transaction(action) as conn:
                found = versions_output_limits(conn, sorted(unknown))
        except DatabaseError:
            return
        if len(self._by_version) + len(unknown) > REMEMBERED:
            self._by_version.clear()
        for version_id in unknown:
            if version_id in found:
                limit = found[version_id]
                self._by_version[version_id] = DEFAULT_OUTPUT_LIMIT if limit is None else limit
            else:
                self._by_version[version_id] = _ABSENT

    def output_limit(self, job: OutboxJob) -> int:
        """The bytes an attempt of ``job`` keeps (0: nothing)."""
        if job.version_id is None:
            return self._without_version(job.schedule)
        limit = self._by_version.get(job.version_id)
        if limit is None:
            self.learn([job], kept=False)
            limit = self._by_version.get(job.version_id)
        if limit == _ABSENT:  # kept as a job of no version
            return self._without_version(job.schedule)
        if limit is None:
            spec = self._config.specs.get(job.schedule) if job.schedule is not None else None
            limit = spec.output_limit if spec is not None else 0
            log.warning("output limit of schedule %s unknown (its version %d could not be "
                        "read): job=%d key=%s keeps %d bytes (%s)", job.schedule,
                        job.version_id, job.id, job.key, limit,
                        "this worker's file of it" if spec is not None else "none: not known",
                        extra={"action": "output_limit_unknown"})
        return limit

    def remember_digest(self, version_id: int, digest: str) -> None:
        """A command job's version digest, read once (``execute.run_command``)."""
        if len(self.digests) >= REMEMBERED:
            self.digests.clear()
        self.digests[version_id] = digest

    def _without_version(self, schedule: str | None) -> int:
        spec = self._config.specs.get(schedule) if schedule is not None else None
        return spec.output_limit if spec is not None else self._config.output_limit

    def _needs_version(self, job: OutboxJob) -> bool:
        # A command runs only when its version is the worker's file (a digest match): it keeps
        # that spec's limit, read from the file (execute.run_command).
        return job.task != "command" and job.version_id not in self._by_version

