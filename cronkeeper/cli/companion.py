"""``cronkeeper run --with-worker``: a worker process started beside the scheduler, for a
single-box trial (the quick start). It is a plain ``cronkeeper worker`` child on the same
database, schema, cluster and schedule files, stopped with the daemon. Production runs
workers as their own units (systemd/cronkeeper-worker.service)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from cronkeeper.cli.connect import Database

log = logging.getLogger("cronkeeper.run")


def start_worker(db: Database, cluster: str, schedules_dir: str) -> subprocess.Popen:
    """The worker runs from the current directory (``python -m``), so a project's handler
    modules there (``examples.handlers``) import as they would in its own worker. The database
    URL travels in the environment, not on the command line other users can read."""
    env = {**os.environ,
           "CRONKEEPER_DATABASE_URL": db.url.render_as_string(hide_password=False)}
    child = subprocess.Popen(
        [sys.executable, "-m", "cronkeeper", "worker", "--schedules", schedules_dir,
         "--schema", db.schema, "--cluster", cluster, "--metrics-address", "off"],
        env=env)
    log.info("started a worker beside the scheduler (pid %d): --with-worker is for a "
             "single-box trial", child.pid, extra={"action": "worker_companion_started"})
    return child


def stop_worker(child: subprocess.Popen | None, timeout: float = 30.0) -> None:
    if child is None or child.poll() is not None:
        return
    child.terminate()  # SIGTERM: the worker drains its running jobs
    try:
        child.wait(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(10)
