"""The README's quick start, end to end, on a clean schema: `cronkeeper run --schedules
examples/schedules/ --with-worker` from the repository's root fires `hello`, the worker started
beside it runs the job and it succeeds; `output` prints what it logged, `history` says so
and `cronkeeper web` shows the period in the strip; Ctrl-C stops both processes. (The README's command uses the embedded
PostgreSQL; here the test database stands in for it.)"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import psycopg
from daemon_harness import wait_for
from web_seed import CRONKEEPER, WebServer, libpq

REPO = Path(__file__).resolve().parent.parent


def test_quick_start_runs_a_job_end_to_end_and_the_web_shows_it(database_url, schema, cluster,
                                                                 tmp_path):
    log = tmp_path / "run.log"
    out = open(log, "w")  # noqa: SIM115 - the child writes it until it exits
    run = subprocess.Popen(
        [CRONKEEPER, "run", "--schedules", "examples/schedules/", "--with-worker",
         "--database-url", database_url, "--schema", schema, "--cluster", cluster,
         "--metrics-address", "off"],
        cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = None
    try:
        with psycopg.connect(libpq(database_url), options=f"-c search_path={schema}",
                             autocommit=True) as db:
            def succeeded() -> int:
                return db.execute("SELECT count(*) FROM outbox WHERE schedule = 'hello' "
                                  "AND state = 'succeeded'").fetchone()[0]

            wait_for(lambda: succeeded() >= 1 or run.poll() is not None, 120,
                     "a hello job to succeed")
            assert run.poll() is None, log.read_text()[-3000:]
            assert db.execute("SELECT count(*) FROM outbox WHERE state = 'dead'").fetchone()[0] == 0
        text = log.read_text()
        assert "hello from cronkeeper: job hello@" in text, text[-3000:]
        # What the README points at next: `cronkeeper output KEY` prints what the job logged
        # (the example's records, kept with its attempt; not cronkeeper's own logger's).
        key = re.search(r"job (hello@\S+Z) ran", text)[1]
        output = subprocess.run(
            [CRONKEEPER, "output", key, "--database-url", database_url, "--schema", schema],
            capture_output=True, text=True, timeout=60)
        assert output.returncode == 0, output.stderr
        assert re.search(rf"INFO examples\.handlers: hello from cronkeeper: job {re.escape(key)} "
                         r"ran \(attempt 1\)", output.stdout), output.stdout + output.stderr

        history = subprocess.run(
            [CRONKEEPER, "history", "hello", "--since", "10m", "--format", "json",
             "--database-url", database_url, "--schema", schema],
            capture_output=True, text=True, timeout=60)
        periods = json.loads(history.stdout)["periods"]
        assert any(p["status"] == "emitted" and p["job_state"] == "succeeded" for p in periods)

        server = WebServer(database_url, schema, cluster, log=tmp_path / "web.log")
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("GET", "/")
        page = conn.getresponse().read().decode()
        row = page[page.index('data-schedule="hello"'):]
        row = row[:row.index("</tr>")]
        assert re.search(r'data-state="emitted"[^>]*><title>[^<]*job succeeded', row), row[:2000]
    finally:
        if server is not None:
            server.stop()
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
        code = run.wait(60)
        out.close()
    text = log.read_text()
    assert code == 0, text[-3000:]
    worker_pid = int(re.search(r"started a worker beside the scheduler \(pid (\d+)\)", text)[1])
    assert not Path(f"/proc/{worker_pid}").exists() or "zombie" in Path(
        f"/proc/{worker_pid}/status").read_text()
