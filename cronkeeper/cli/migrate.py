"""cronkeeper migrate: create or upgrade the schema (safe when several instances run it at once)."""

from __future__ import annotations

import click

from cronkeeper.cli.common import database_options
from cronkeeper.cli.connect import open_database
from cronkeeper.db.engine import redact
from cronkeeper.db.migrate import latest_version, migrate


@click.command("migrate")
@database_options
def migrate_command(database_url: str | None, schema: str, cluster: str) -> None:
    """Apply pending migrations to the schema."""
    db = open_database(database_url, schema, check=False)
    applied = migrate(db.engine, schema)
    where = f"schema {schema!r} on {redact(db.url)}"
    if applied:
        click.echo(f"applied migrations {', '.join(map(str, applied))}: {where} is at version {latest_version()}")
    else:
        click.echo(f"{where} is current (version {latest_version()})")
