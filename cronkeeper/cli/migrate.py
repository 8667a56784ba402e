"""cronkeeper migrate: create or upgrade the schema (safe when several instances run it at once)."""

from __future__ import annotations

import json

import click

from cronkeeper.cli.common import database_options, format_option, safe
from cronkeeper.cli.connect import open_database
from cronkeeper.db.engine import redact
from cronkeeper.db.migrate import latest_version, migrate
from cronkeeper.operations.upgrade import MigrationPlan, migration_plan


@click.command("migrate")
@database_options
@click.option("--dry-run", is_flag=True,
              help="List the migrations it would apply and whether the running instances are "
                   "compatible with the result; change nothing (exit 1 when one is not).")
@format_option
def migrate_command(database_url: str | None, schema: str, cluster: str, dry_run: bool,
                    fmt: str) -> None:
    """Apply pending migrations to the schema."""
    db = open_database(database_url, schema, check=False, migrate_embedded=not dry_run)
    where = f"schema {schema!r} on {redact(db.url)}"
    if dry_run:
        plan = migration_plan(db.engine, schema, cluster)
        click.echo(json.dumps(_plan_json(plan), indent=2) if fmt == "json" else _plan_text(plan, where))
        if not plan.all_compatible:
            raise click.exceptions.Exit(1)
        return
    applied = migrate(db.engine, schema)
    if applied:
        click.echo(f"applied migrations {', '.join(map(str, applied))}: {where} is at version {latest_version()}")
    else:
        click.echo(f"{where} is current (version {latest_version()})")


def _plan_json(plan: MigrationPlan) -> dict:
    return {
        "schema_version": plan.schema_version,
        "pending": [{"version": m.version, "name": m.name, "oldest_release": m.oldest_release}
                    for m in plan.pending],
        "result_version": plan.result_version,
        "result_oldest_release": plan.result_oldest_release,
        "instances": [{"instance_id": i.instance_id, "kind": i.kind, "version": i.version,
                       "compatible": i.compatible, "note": i.note} for i in plan.instances],
        "compatible": plan.all_compatible,
    }


def _plan_text(plan: MigrationPlan, where: str) -> str:
    lines = [f"{where} is at version {plan.schema_version}"]
    if plan.pending:
        lines.append("migrate would apply:")
        lines += [f"  {m.version:04d} {m.name} (works with {m.oldest_release} and newer)"
                  for m in plan.pending]
    else:
        lines.append("nothing to apply")
    lines.append(f"the schema would then be version {plan.result_version}, which releases "
                 f"{plan.result_oldest_release} and newer work with")
    if plan.instances:
        lines.append("running instances (heartbeat within 30 s):")
        for i in plan.instances:
            mark = "compatible" if i.compatible else "NOT COMPATIBLE"
            lines.append(f"  {safe(i.instance_id)} ({i.kind}, {safe(i.version)}): {mark}; {i.note}")
    else:
        lines.append("no instance is running")
    return "\n".join(lines)
