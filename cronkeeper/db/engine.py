"""Database URLs, engines and error translation. psycopg 3 is the driver whatever the URL says."""

from __future__ import annotations

import contextlib
import hashlib
import re
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import psycopg

from cronkeeper.errors import DatabaseError, UsageError

# SQLAlchemy is imported when an engine is made or a URL parsed, not by this module: status
# runs on psycopg alone (a fifth of its CPU was importing SQLAlchemy, docs/performance.md).
if TYPE_CHECKING:
    import sqlalchemy as sa
    from sqlalchemy.engine import URL as URL

    # What code outside db/ may name: the driver's types and errors, without importing the driver.
    Engine = sa.Engine
    Connection = sa.Connection
    DRIVER_ERRORS: tuple[type[BaseException], ...]
    CONNECTION_ERRORS: tuple[type[BaseException], ...]
RawConnection = psycopg.Connection


def __getattr__(name: str) -> Any:
    """``Engine``, ``Connection``, ``URL`` and the error tuples, importing SQLAlchemy when first
    named (PEP 562): the daemon and the other commands name them, status does not. Any other
    name (``__path__``, which every ``from ... import`` asks for) is refused before importing."""
    if name not in ("Engine", "Connection", "URL", "DRIVER_ERRORS", "CONNECTION_ERRORS"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import sqlalchemy as sa
    from sqlalchemy import exc as sa_exc

    # A pool with no connection free within its timeout (sa_exc.TimeoutError) is the database
    # unavailable to this process for now: said, and retried, as an outage is.
    return {"Engine": sa.Engine, "Connection": sa.Connection, "URL": sa.engine.URL,
            "DRIVER_ERRORS": (sa_exc.DBAPIError, sa_exc.TimeoutError, psycopg.Error),
            "CONNECTION_ERRORS": (psycopg.OperationalError, sa_exc.OperationalError)}[name]


def _driver_errors() -> tuple[type[BaseException], ...]:
    """psycopg's errors, and SQLAlchemy's wrappers of them once SQLAlchemy is loaded (no
    SQLAlchemy connection can have raised one before), and its pool's timeout (no connection
    free: the database unavailable to this process for now)."""
    if "sqlalchemy" not in sys.modules:
        return (psycopg.Error,)
    from sqlalchemy import exc as sa_exc

    return (sa_exc.DBAPIError, sa_exc.OperationalError, sa_exc.TimeoutError, psycopg.Error)


SCHEMA_PATTERN = re.compile(r"[a-z_][a-z0-9_]{0,62}")

# A peer that goes silent (a partition: no FIN, no RST) is given up after about 11 s, whatever
# the connection was doing. Idle, TCP keepalives notice it (idle 5 s + 2 s x 3 probes). With
# data sent and not yet acknowledged (a query just sent, a reply the peer had not acked, as
# after every commit for a delayed ACK's 40 ms), the kernel sends no keepalives at all and
# would retransmit for about 15 minutes (tcp_retries2): the TCP user timeout bounds that case
# by the same 11 s. Measured in tests/test_daemon_netns_partition.py.
DEAD_PEER_SECONDS = 11
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
              "tcp_user_timeout": DEAD_PEER_SECONDS * 1000}
# The same on the server's side of the lock session, so PostgreSQL drops a vanished leader's
# backend, and with it the lock.
SERVER_KEEPALIVES = ("-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=3"
                     f" -c tcp_user_timeout={DEAD_PEER_SECONDS * 1000}")


def driver(conn: sa.Connection | psycopg.Connection) -> psycopg.Connection:
    """The psycopg connection under a SQLAlchemy one (or the psycopg connection itself): the one
    way to the driver, so that no code outside db/ reaches for ``driver_connection``
    (tests/test_layout.py refuses it there)."""
    if isinstance(conn, psycopg.Connection):
        return conn
    return cast(psycopg.Connection, conn.connection.driver_connection)


def one_row(cursor: psycopg.Cursor[Any]) -> tuple[Any, ...]:
    """The row of a statement that always returns exactly one (an aggregate, a function call)."""
    row = cursor.fetchone()
    if row is None:
        raise DatabaseError("the database returned no row where one is always returned")
    return row


def check_schema_name(schema: str) -> str:
    if not isinstance(schema, str) or not SCHEMA_PATTERN.fullmatch(schema):
        raise UsageError(
            f"invalid schema name {schema!r}: use lower-case letters, digits and underscores, "
            "starting with a letter or underscore (at most 63 characters)"
        )
    return schema


def normalize_url(url: str) -> URL:
    """Accept postgresql://, postgres:// and postgresql+psycopg://; always drive with psycopg 3."""
    raw = url.strip()
    netloc = raw.split("://", 1)[-1].split("/", 1)[0]
    if netloc.count("@") > 1:
        raise UsageError(
            "the database URL has more than one '@' before the host: percent-encode an '@' in "
            "the user name or password as %40"
        )
    if raw.startswith("postgres://"):
        raw = "postgresql://" + raw[len("postgres://") :]
    raw = _hosts_to_query(raw)
    from sqlalchemy import exc as sa_exc
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(raw)
    except (sa_exc.ArgumentError, ValueError) as exc:
        raise UsageError(f"cannot parse database URL {redact(url)!r}: {exc}") from None
    if parsed.get_backend_name() != "postgresql":
        raise UsageError(
            f"database URL {redact(url)!r} is not PostgreSQL: use postgresql://user@host:port/db"
        )
    return parsed.set(drivername="postgresql+psycopg")


def _split_host(item: str) -> tuple[str, str]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` -> (host, port or "")."""
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else ""
    host, _, port = item.partition(":")
    return host, port


def _hosts_to_query(raw: str) -> str:
    """libpq's multi-host form ``postgresql://u@h1:p1,h2:p2/db`` (what failover setups such as
    Patroni and pg_auto_failover hand out) as ``?host=h1,h2&port=p1,p2``, a form SQLAlchemy can
    parse and passes to libpq unchanged: libpq then tries each host in turn (with
    ``target_session_attrs=read-write``, until it finds the primary)."""
    scheme, sep, rest = raw.partition("://")
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:]
    userinfo, at, hosts = netloc.rpartition("@")
    if not sep or "," not in hosts:
        return raw
    pairs = [_split_host(item) for item in hosts.split(",")]
    if any(not host or (port and not port.isdigit()) for host, port in pairs):
        raise UsageError(f"cannot parse the host list {hosts!r} in the database URL: expected "
                         "host[:port],host[:port],...")
    path, _, query = tail.lstrip("/").partition("?")
    params = [p for p in query.split("&") if p]
    if any(p.split("=", 1)[0] in ("host", "port", "hostaddr") for p in params):
        raise UsageError("the database URL names hosts both before the path and in its query: "
                         "use one of the two")
    params.append("host=" + ",".join(host for host, _ in pairs))
    if any(port for _, port in pairs):
        params.append("port=" + ",".join(port for _, port in pairs))
    return f"{scheme}://{userinfo}{at}/{path}?{'&'.join(params)}"


def redact(url: str | URL) -> str:
    """The URL with its password hidden: safe for logs, errors and status."""
    text = url if isinstance(url, str) else url.render_as_string(hide_password=True)
    text = re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", text)
    return re.sub(r"((?:^|[?&])(?:ssl)?password=)[^&]*", r"\1***", text, flags=re.I)


def conninfo(url: URL, *, options: str = "") -> str:
    """A libpq conninfo string for a raw psycopg connection (used for the lock session)."""
    # The dialect's own translation, so the lock session connects exactly as the engine does
    # (several hosts included: ``?host=a:1&host=b:2`` becomes host=a,b port=1,2 for libpq).
    _, connect_args = url.get_dialect()().create_connect_args(url)
    params: dict[str, Any] = {**connect_args, **KEEPALIVES}
    if options:
        params["options"] = (params.get("options", "") + " " + options).strip()
    return psycopg.conninfo.make_conninfo(**{k: v for k, v in params.items() if v is not None})


# A URL whose every part SQLAlchemy would take as written (no percent-escape, no IPv6, one
# host): ``direct_url`` reads it without SQLAlchemy; any other goes through ``normalize_url``.
_PLAIN_URL = re.compile(
    r"postgres(?:ql)?(?:\+psycopg)?://(?:(?P<user>[^:@/?#%\[\]]+)(?::(?P<password>[^@/?#%]*))?@)?"
    r"(?P<host>[A-Za-z0-9._-]*)(?::(?P<port>\d+))?(?:/(?P<dbname>[^/?#%]*))?"
    r"(?:\?(?P<query>[^#%\[\]]*))?")


def direct_url(url: str) -> tuple[dict[str, str], str] | None:
    """The connection parameters of a plain URL and the URL as ``redact(normalize_url(url))``
    shows it, read without SQLAlchemy; None for a URL that is not plain (a host list, an
    escape, a bad one): ``normalize_url`` then reads it, or says what is wrong with it."""
    from urllib.parse import parse_qsl, quote_plus

    match = _PLAIN_URL.fullmatch(url.strip())
    if match is None or match["port"] and not 0 < int(match["port"]) < 65536:
        return None
    try:
        query = parse_qsl(match["query"] or "", keep_blank_values=True, strict_parsing=True)
    except ValueError:
        return None
    keys = [k for k, _ in query]
    if len(set(keys)) != len(keys) or {"host", "port", "hostaddr"} & set(keys) and match["host"]:
        return None
    params = {k: v for k, v in (("user", match["user"]), ("password", match["password"]),
                                ("host", match["host"]), ("port", match["port"]),
                                ("dbname", match["dbname"])) if v}
    params.update(query)
    shown = "postgresql+psycopg://"
    if match["user"]:
        shown += match["user"] + (":***" if match["password"] is not None else "") + "@"
    shown += (match["host"] or "") + (f":{match['port']}" if match["port"] else "")
    shown += f"/{match['dbname']}" if match["dbname"] else ""
    if query:
        shown += "?" + "&".join(f"{quote_plus(k)}={quote_plus(v)}" for k, v in sorted(query))
    return params, redact(shown)


class DirectEngine:
    """What a one-shot reader (status) uses of an engine, on psycopg alone: ``connect()`` opens
    a connection as ``make_engine``'s would (same keepalives, search_path, timeout) and
    ``close()``s it after; no pool, nothing to ``dispose``."""

    def __init__(self, params: dict[str, str], schema: str, *, application_name: str) -> None:
        self.params: dict[str, Any] = {
            **params, **KEEPALIVES, "application_name": application_name,
            "options": f"-c search_path={check_schema_name(schema)}", "connect_timeout": 10}

    @contextlib.contextmanager
    def connect(self) -> Iterator[psycopg.Connection]:
        # An option libpq does not know fails here, in the caller's translate_errors, as the
        # engine's connect did.
        conn = psycopg.connect(**self.params)
        try:
            yield conn
        finally:
            conn.close()

    def dispose(self) -> None:
        """Nothing pooled: each connection closed when its ``connect()`` ended."""


def make_engine(url: URL, schema: str, *, pool_size: int = 5, application_name: str = "cronkeeper") -> sa.Engine:
    """An engine whose connections resolve cronkeeper's tables through search_path."""
    import sqlalchemy as sa

    check_schema_name(schema)
    return sa.create_engine(
        url,
        pool_size=pool_size,
        max_overflow=5,
        pool_pre_ping=True,
        connect_args={
            **KEEPALIVES,
            "application_name": application_name,
            "options": f"-c search_path={schema}",
            "connect_timeout": 10,
        },
    )


def limit_statements(engine: sa.Engine, seconds: int) -> None:
    """From now on every statement on ``engine``'s connections is cancelled after ``seconds``,
    a wait for a lock included (``statement_timeout``), so that a reader behind an ACCESS
    EXCLUSIVE lock (a migration's DDL, a ``VACUUM FULL``) gets an error instead of waiting for
    as long as the lock is held. Connections already pooled are closed, to be opened with it."""
    import sqlalchemy as sa

    def limit(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute(f"SET statement_timeout = {int(seconds) * 1000}")
        dbapi_connection.commit()  # a SET in a transaction rolled back would be undone

    sa.event.listen(engine, "connect", limit)
    engine.dispose()


def make_single_engine(url: URL, schema: str, *, application_name: str) -> sa.Engine:
    """An engine without a pool, for the one long-lived lock connection."""
    import sqlalchemy as sa
    from sqlalchemy.pool import NullPool

    check_schema_name(schema)
    return sa.create_engine(
        url,
        poolclass=NullPool,
        connect_args={
            **KEEPALIVES,
            "application_name": application_name,
            "options": f"-c search_path={schema} {SERVER_KEEPALIVES}",
            "connect_timeout": 10,
        },
    )


def advisory_key(text: str) -> int:
    """A signed 64-bit advisory lock key: the first 8 bytes of SHA-256 of ``text``."""
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def leader_lock_key(schema: str, cluster: str) -> int:
    return advisory_key(f"cronkeeper:{schema}:{cluster}")


def serial_lock_key(schema: str, schedule: str) -> int:
    """The transaction lock a serial schedule's claim takes first (docs/outbox.md, "Claim"):
    workers and relays, and any consumer in another language, take the same one."""
    return advisory_key(f"cronkeeper-serial:{schema}:{schedule}")


def migration_lock_key(schema: str) -> int:
    # A different prefix, so no (schema, cluster) pair can ever produce this key.
    return advisory_key(f"cronkeeper-migrate:{schema}")


def advisory_key_parts(key: int) -> tuple[int, int]:
    """pg_locks shows a bigint advisory key as classid (high 32 bits) and objid (low 32 bits)."""
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    return unsigned >> 32, unsigned & 0xFFFFFFFF


def describe(exc: BaseException) -> str:
    """A one-line message for a driver error, password-free."""
    if type(exc).__name__ == "TimeoutError" and type(exc).__module__ == "sqlalchemy.exc":
        # The server is fine: this process's connections are all in use (handlers holding
        # their jobs' transactions, say).
        return (f"no connection free in this process's pool: {str(exc).split(' (Background')[0]}")
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    return re.sub(r"password=\S+", "password=***", text)


def refuses_writes(exc: BaseException) -> bool:
    """The server answers but cannot write for want of resources: SQLSTATE 53100 (disk_full:
    "could not extend file ...: No space left on device") or 53200 (out_of_memory). Reads go
    on; some writes may too (an update that fits its page), so a success says little."""
    return _sqlstate(exc) in {"53100", "53200"}


def conflicts(exc: BaseException) -> bool:
    """The server rolled the statement back to break a conflict between transactions: SQLSTATE
    40P01 (deadlock_detected) or 40001 (serialization_failure). The database is there and
    answering; trying the same work again is the remedy, not waiting for it to come back."""
    return _sqlstate(exc) in {"40P01", "40001"}


def _sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of the driver error behind ``exc`` (through DatabaseError's and
    SQLAlchemy's wrapping), None when there is none."""
    orig = getattr(exc, "orig", None) or exc
    while isinstance(orig, DatabaseError) and orig.__cause__ is not None:
        orig = orig.__cause__
        orig = getattr(orig, "orig", None) or orig
    return getattr(orig, "sqlstate", None)


@contextlib.contextmanager
def translate_errors(action: str) -> Iterator[None]:
    """Turn driver errors into cronkeeper's DatabaseError at the edge of db/."""
    try:
        yield
    except Exception as exc:
        if not isinstance(exc, _driver_errors()):
            raise
        raise DatabaseError(f"{action}: {describe(exc)}") from exc


def caller_rows(connection: Any, sql: str, params: dict[str, Any], action: str) -> list[tuple]:
    """Run a statement in an application's transaction (``cronkeeper.schedules``): through
    SQLAlchemy, so that its transaction begins and the caller's commit covers the statement;
    or on the psycopg connection as it is. Driver errors become DatabaseError(``action``)."""
    with translate_errors(action):
        if isinstance(connection, psycopg.Connection):
            return connection.execute(sql, params).fetchall()
        if "sqlalchemy" in sys.modules:
            import sqlalchemy as sa

            if isinstance(connection, sa.Connection):
                return list(connection.exec_driver_sql(sql, params).fetchall())
    raise UsageError(f"cronkeeper.schedules needs a SQLAlchemy Connection or a psycopg "
                     f"Connection, not {type(connection).__name__}")
