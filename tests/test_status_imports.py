"""``cronkeeper status`` runs on psycopg alone: SQLAlchemy (a fifth of its CPU at 10,000
schedules, docs/performance.md) is not imported when the URL is plain and the schema current.
The command runs in a fresh interpreter, so that what other tests loaded does not hide an
import; the URL reading it does instead of SQLAlchemy's is held to SQLAlchemy's own."""

from __future__ import annotations

import json
import subprocess
import sys

import psycopg
import pytest

from cronkeeper.db.engine import KEEPALIVES, conninfo, direct_url, normalize_url, redact

RUN_STATUS = (
    "import sys\n"
    "from cronkeeper.cli.main import main\n"
    "try:\n"
    "    sys.argv = ['cronkeeper', *sys.argv[1:]]\n"
    "    main()\n"
    "except SystemExit as exc:\n"
    "    code = exc.code\n"
    "else:\n"
    "    code = 0\n"
    "print('SQLALCHEMY', sorted(m for m in sys.modules if m.split('.')[0] == 'sqlalchemy')[:3],"
    " file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def status(*args: str, env_url: str | None = None) -> subprocess.CompletedProcess:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONKEEPER_")}
    if env_url is not None:
        env["CRONKEEPER_DATABASE_URL"] = env_url
    return subprocess.run([sys.executable, "-c", RUN_STATUS, "status", *args],
                          capture_output=True, text=True, env=env)


def sqlalchemy_loaded(proc: subprocess.CompletedProcess) -> list[str]:
    line = [x for x in proc.stderr.splitlines() if x.startswith("SQLALCHEMY ")][-1]
    return eval(line.split(" ", 1)[1])  # noqa: S307 - our own print of a list


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["postgresql://", "postgresql+psycopg://"])
def test_status_against_a_migrated_schema_imports_no_sqlalchemy(database_url, schema, cluster,
                                                                 scheme):
    url = scheme + database_url.split("://", 1)[1]
    table = status("--schema", schema, "--cluster", cluster, env_url=url)
    assert table.returncode == 0, table.stderr
    assert sqlalchemy_loaded(table) == [], table.stderr
    assert f"schema {schema}" in table.stdout and "DIAGNOSIS" in table.stdout
    proc = status("--schema", schema, "--cluster", cluster, "--format", "json", env_url=url)
    assert proc.returncode == 0, proc.stderr
    assert sqlalchemy_loaded(proc) == [], proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == schema and doc["cluster"] == cluster
    # The URL shown as SQLAlchemy showed it (the password hidden), the leader absent.
    assert doc["database"] == redact(normalize_url(url)) and doc["leader"] is None


@pytest.mark.slow
def test_status_on_an_old_schema_says_so_as_before(database_url, schema, cluster):
    """The compatibility check on psycopg: a schema behind still ends status with the same
    message (and still without SQLAlchemy)."""
    with psycopg.connect(database_url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'DELETE FROM "{schema}".schema_migrations WHERE version = '
                     f'(SELECT max(version) FROM "{schema}".schema_migrations)')
    proc = status("--schema", schema, "--cluster", cluster, env_url=database_url)
    assert proc.returncode != 0
    assert f"schema {schema!r} is at version" in proc.stderr and "cronkeeper migrate" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sqlalchemy_loaded(proc) == []


@pytest.mark.parametrize("url", [
    "postgresql://postgres@127.0.0.1:5432/test",
    "postgres://a:secret@localhost/db?sslmode=disable",
    "postgresql+psycopg://u:@/postgres?host=/tmp/x y",
    "postgresql://postgres:@/postgres?host=/tmp/tmpabc/sock",
    "postgresql://u@h:5432/d?application_name=z&connect_timeout=3",
    "postgresql:///db",
])
def test_a_plain_url_reads_as_sqlalchemy_reads_it(url):
    params, shown = direct_url(url)
    parsed = normalize_url(url)
    assert shown == redact(parsed)
    theirs = psycopg.conninfo.conninfo_to_dict(conninfo(parsed))
    assert params == {k: str(v) for k, v in theirs.items() if k not in KEEPALIVES}


@pytest.mark.parametrize("url", [
    "postgresql://u@h1:5432,h2:5433/db",  # a host list
    "postgresql://u%40x:p@h/db",  # an escape
    "postgresql://u@[::1]:5432/db",  # IPv6
    "mysql://u@h/db",  # not PostgreSQL: normalize_url says so
    "postgresql://u@h:99999/db",  # a bad port: normalize_url says so
    "postgresql://u@h/db?host=a",  # a host twice
])
def test_any_other_url_is_left_to_sqlalchemy(url):
    assert direct_url(url) is None


@pytest.mark.slow
@pytest.mark.parametrize(("url", "said"), [
    ("postgresql://postgres@127.0.0.1:5432/test?foo=bar",
     'error: checking the schema version: invalid connection option "foo"'),
    ("postgresql://postgres@127.0.0.1:1/test",
     'error: checking the schema version: connection failed: connection to server at "127.0.0.1", '
     "port 1 failed: Connection refused"),
])
def test_a_bad_or_unreachable_database_is_said_as_before(url, said):
    """What the engine's connect said, the direct connection says: one line, no traceback."""
    proc = status(env_url=url)
    assert proc.returncode != 0
    assert said in proc.stderr and "Traceback" not in proc.stderr
