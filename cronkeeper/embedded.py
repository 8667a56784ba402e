"""The embedded PostgreSQL (the ``pgserver`` package): how a newcomer without a database runs
cronkeeper. Single node; the server stops when the last cronkeeper process using it exits."""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

from cronkeeper.errors import CronkeeperError

log = logging.getLogger("cronkeeper.embedded")


def default_data_dir() -> Path:
    configured = os.environ.get("CRONKEEPER_DATA_DIR")
    if configured:
        return Path(configured)
    state = os.environ.get("STATE_DIRECTORY")  # systemd's StateDirectory=
    if state:
        return Path(state.split(":")[0]) / "pgdata"
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "cronkeeper" / "pgdata"


def start(data_dir: Path | None = None) -> str:
    """Start (or join) the embedded server; return its postgresql:// URL."""
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    try:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            import pgserver  # noqa: PLC0415 - optional dependency, imported only when needed
    except ImportError:
        raise CronkeeperError(
            "no database configured (--database-url / CRONKEEPER_DATABASE_URL) and the embedded "
            "PostgreSQL is not installed: pip install 'cronkeeper[embedded]', or point "
            "cronkeeper at a PostgreSQL server"
        ) from None
    try:
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = pgserver.get_server(data_dir)
            url = server.get_uri()
    except Exception as exc:  # noqa: BLE001 - pgserver raises many kinds; report one message
        raise CronkeeperError(f"could not start the embedded PostgreSQL in {data_dir}: {exc}") from None
    log.warning(
        "no database configured: using the embedded PostgreSQL in %s (single node; set "
        "CRONKEEPER_DATABASE_URL to run several instances on a shared PostgreSQL)",
        data_dir,
        extra={"action": "embedded_database"},
    )
    return url
