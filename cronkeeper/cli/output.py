"""cronkeeper output KEY [--attempt N]: what one attempt of a job printed (docs/worker.md, "What a
job printed"). The bytes as captured go to stdout, for a pipe or a file; on a terminal, control
characters other than newline and tab are shown escaped (and invalid UTF-8 as ``\\xNN``), so
that nothing a job printed can drive the operator's terminal. The lookup is
``cronkeeper.operations.output``; this renders it."""

from __future__ import annotations

import sys

import click

from cronkeeper.cli.common import database_options, safe
from cronkeeper.operations.output import attempt_output
from cronkeeper.output import for_terminal


@click.command("output")
@database_options
@click.argument("key")
@click.option("--attempt", type=int, default=None, metavar="N",
              help="This attempt (as `explain` numbers them; negative: from before a dlq "
                   "replay). Default: the newest.")
def output_command(database_url, schema, cluster, key, attempt) -> None:
    """Print what an attempt of a job printed, by the job's idempotency key (exit 1 when the
    key or the attempt is unknown)."""
    from cronkeeper.cli.connect import open_database

    db = open_database(database_url, schema)
    found = attempt_output(db.engine, key, attempt)
    if found.output is None:
        click.echo(safe(found.note), err=True)
        return
    if sys.stdout.isatty():
        text = for_terminal(found.output)
        click.echo(text, nl=bool(text) and not text.endswith("\n"))
        return
    sys.stdout.flush()
    sys.stdout.buffer.write(found.output)
    sys.stdout.buffer.flush()
