"""Database URLs: accepted forms, and the password never shown."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cronkeeper.cli.main import cli
from cronkeeper.db.engine import normalize_url, redact
from cronkeeper.errors import UsageError


@pytest.mark.parametrize("url", ["postgresql://u@h/db", "postgres://u@h/db", "postgresql+psycopg://u@h/db"])
def test_every_accepted_form_drives_psycopg(url):
    assert normalize_url(url).drivername == "postgresql+psycopg"


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("postgresql://postgres:s3cret@127.0.0.1:1/test", "s3cret"),
        ("postgresql://postgres@127.0.0.1/test?password=xyzzy&sslmode=disable", "xyzzy"),
        ("postgresql://u:p%40ss@h/db?sslpassword=zz", "zz"),
    ],
)
def test_redact_hides_every_password(url, secret):
    assert secret not in redact(url)
    assert secret not in redact(normalize_url(url))


def test_an_unencoded_at_sign_in_the_password_is_refused_with_the_fix():
    with pytest.raises(UsageError, match="%40"):
        normalize_url("postgresql://postgres:s3c@ret@127.0.0.1:1/test")


@pytest.mark.parametrize("command", [["migrate"], ["status"], ["history"], ["pause", "x"]])
def test_commands_against_an_unreachable_database_never_print_the_password(command):
    result = CliRunner().invoke(
        cli, [*command, "--database-url", "postgresql://postgres:s3cret@127.0.0.1:1/test?password=xyzzy"]
    )
    assert result.exit_code != 0
    assert "s3cret" not in result.output and "xyzzy" not in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("postgresql://u@h1:5001,h2:5002/db?target_session_attrs=read-write", "h1,h2", "5001,5002"),
        ("postgres://u@h1,h2:5433/db", "h1,h2", ",5433"),
        ("postgresql://u@[::1]:5001,h2/db", "::1,h2", "5001,"),
        ("postgresql://u@/db?host=h1:5001&host=h2:5002", "h1,h2", "5001,5002"),
    ],
)
def test_multi_host_urls_reach_libpq_whole_for_the_pool_and_the_lock_session(url, host, port):
    """Failover setups hand out libpq's multi-host URL; SQLAlchemy cannot parse its netloc, and
    the lock session once kept only the last host of the query form."""
    from psycopg.conninfo import conninfo_to_dict

    from cronkeeper.db.engine import conninfo

    parsed = normalize_url(url)
    assert parsed.database == "db"
    info = conninfo_to_dict(conninfo(parsed))
    assert (info["host"], info["port"]) == (host, port)
    _, engine_args = parsed.get_dialect()().create_connect_args(parsed)
    assert (engine_args["host"], str(engine_args["port"])) == (host, port)
    if "target_session_attrs" in url:
        assert info["target_session_attrs"] == engine_args["target_session_attrs"] == "read-write"


def test_a_multi_host_url_keeps_its_password_hidden_and_refuses_a_bad_host_list():
    url = normalize_url("postgresql://u:s3cret@h1:1,h2:2/db")
    assert "s3cret" not in redact(url) and url.password == "s3cret"
    with pytest.raises(UsageError, match="host list"):
        normalize_url("postgresql://u@h1:x,h2/db")
    with pytest.raises(UsageError, match="both"):
        normalize_url("postgresql://u@h1,h2/db?host=h3")


def test_a_multi_host_url_connects_to_the_host_that_answers():
    """The first host refuses connections: the pool and the lock session both go on to the next
    (a private server on TCP, so the test means the same wherever the suite runs)."""
    from daemon_harness import shared_postgres

    from cronkeeper.db.engine import make_engine
    from cronkeeper.db.leadership import lock_connect

    pg = shared_postgres()
    url = normalize_url(f"postgresql://postgres@127.0.0.1:1,127.0.0.1:{pg.port}/{pg.database}"
                        "?target_session_attrs=read-write")
    engine = make_engine(url, "public", pool_size=1)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT inet_server_port()").scalar() == pg.port
    finally:
        engine.dispose()
    with lock_connect(url, "public", "multi-host-test") as conn:
        assert conn.execute("SELECT inet_server_port()").fetchone()[0] == pg.port


@pytest.mark.parametrize("call", ["dlq_show", "schedule_delete"])
def test_operations_that_open_their_own_connection_say_the_database_is_away(call):
    """``dlq show`` (and the web's dead-letter page) and ``schedules delete`` opened their
    connection outside ``translate_errors``: a database gone since the command started came out
    as "internal error: OperationalError ... this is a bug", or a web page's 500."""
    from cronkeeper.db.engine import make_engine
    from cronkeeper.errors import DatabaseError
    from cronkeeper.operations import dlq, schedules

    engine = make_engine(normalize_url("postgresql://postgres@127.0.0.1:1/test"), "public",
                         pool_size=1)
    try:
        with pytest.raises(DatabaseError, match="connection|connect") as raised:
            if call == "dlq_show":
                dlq.show_document(engine, {"id": 1})
            else:
                schedules.delete(engine, "public", "nightly")
        assert ("dead letter's attempts" if call == "dlq_show" else
                "deleting the runtime schedule") in str(raised.value)
    finally:
        engine.dispose()
