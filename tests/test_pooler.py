"""Behind a transaction-pooling proxy a session advisory lock cannot elect a leader: the daemon
must refuse to start and say why. Uses a real PgBouncer in transaction mode on loopback."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
from daemon_harness import shared_postgres


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def private_pg():
    """The private server on a TCP port of 127.0.0.1 (pgbouncer runs as another OS user and
    cannot reach an embedded server's socket directory)."""
    return shared_postgres()


@pytest.fixture
def pgbouncer(private_pg):
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    assert os.path.exists(binary), "pgbouncer is needed (Debian package pgbouncer)"
    target = psycopg.conninfo.conninfo_to_dict(private_pg.url)
    port = _free_port()
    workdir = Path(tempfile.mkdtemp(prefix="ck-pgbouncer-"))
    workdir.chmod(0o777)  # pgbouncer refuses root: it runs as the postgres user and writes here
    (workdir / "users.txt").write_text(f'"{target.get("user", "postgres")}" ""\n')
    host = target.get("host", "127.0.0.1")
    (workdir / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={host} port={target.get('port', 5432)}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {workdir}/users.txt\n"
        "pool_mode = transaction\ndefault_pool_size = 4\n"
        "ignore_startup_parameters = extra_float_digits,options,application_name\n"
        f"logfile = {workdir}/pgbouncer.log\npidfile = {workdir}/pgbouncer.pid\n"
    )
    for f in workdir.iterdir():
        f.chmod(0o644)
    user = ["-u", "postgres"] if os.geteuid() == 0 else []
    proc = subprocess.Popen([binary, *user, str(workdir / "pgbouncer.ini")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"postgresql://{target.get('user', 'postgres')}@127.0.0.1:{port}/{target.get('dbname', 'test')}"
    deadline = time.monotonic() + 15
    while True:
        try:
            with psycopg.connect(url, connect_timeout=2, prepare_threshold=None) as conn:
                conn.execute("SELECT 1")
            break
        except psycopg.Error:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                log = (workdir / "pgbouncer.log").read_text() if (workdir / "pgbouncer.log").exists() else ""
                pytest.fail(f"pgbouncer did not start: {proc.stdout.read() if proc.stdout else ''} {log}")
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=10)
    shutil.rmtree(workdir, ignore_errors=True)


def test_run_refuses_a_transaction_pooling_proxy(pgbouncer, private_pg, cluster, tmp_path):
    schema = private_pg.new_schema()
    schedules = tmp_path / "schedules"
    schedules.mkdir()
    (schedules / "a.toml").write_text(
        '[ping]\nevery = "10s"\ntimezone = "UTC"\nmisfire = "skip"\ntask = "t.ping"\nowner = "ops"\n'
    )
    result = subprocess.run(
        [str(Path(sys.executable).with_name("cronkeeper")), "run", "--database-url", pgbouncer,
         "--schema", schema, "--cluster", cluster, "--schedules", str(schedules),
         "--metrics-address", "off"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert "transaction-pooling proxy" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_direct_connection_is_accepted_as_pinned(database_url, schema):
    from cronkeeper.db import leadership as dbl
    from cronkeeper.db.engine import normalize_url
    from cronkeeper.db.sessions import session_is_pinned

    url = normalize_url(database_url)
    with dbl.lock_connect(url, schema, "t") as conn, dbl.lock_connect(url, schema, "probe") as probe:
        assert session_is_pinned(conn, probe) is True


def test_worker_wakeups_detect_a_transaction_pooling_proxy_and_leave_polling(pgbouncer, private_pg, caplog):
    """LISTEN through PgBouncer in transaction mode would listen on a backend the proxy hands
    to others: the worker's listener must notice, say so, and leave the worker to poll."""
    import logging
    import threading

    from cronkeeper.db.engine import make_engine, normalize_url
    from cronkeeper.worker.wakeups import Wakeups

    engine = make_engine(normalize_url(pgbouncer), private_pg.new_schema())
    woken: list[int] = []
    stopping = threading.Event()
    wakeups = Wakeups(engine, "cronkeeper", 1.0, lambda: woken.append(1), stopping)
    with caplog.at_level(logging.WARNING, logger="cronkeeper.worker"):
        wakeups.start()
        wakeups.thread.join(60)
    stopping.set()
    engine.dispose()
    assert not wakeups.thread.is_alive()
    assert not wakeups.listening.is_set() and woken == []
    unavailable = [r for r in caplog.records if getattr(r, "action", None) == "listen_unavailable"]
    assert len(unavailable) == 1
    assert "transaction-pooling proxy" in unavailable[0].getMessage()
    assert "polls every 1s" in unavailable[0].getMessage()
