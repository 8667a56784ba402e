"""cronkeeper dlq list|show|replay|discard: dead letters (§7).

Replay and discard take dead-letter ids as arguments (``dlq replay 42 43``) or with ``--id``,
and the filters below; with neither, every dead letter. They print how many jobs and which tasks they touch and ask every time; ``--yes``
for scripts; without a terminal and without ``--yes`` they refuse (exit 1) and change nothing.
Replay: state back to available, run_after now, a fresh attempt budget (attempts reset to 0; the
earlier attempts stay recorded, renumbered negative, and ``explain`` still lists them).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from cronkeeper.cli.common import database_options, format_option, safe
from cronkeeper.db.outbox import DeadSelection
from cronkeeper.errors import CronkeeperError
from cronkeeper.operations.dlq import (
    MAX_DOCUMENT,
    apply,
    choose,
    dumps,
    iso,
    list_document,
    listing,
    select_dead,
    selection,
    show_document,
)
from cronkeeper.output import escape_text


def filters(func):
    for option in reversed([
        click.option("--schedule", default=None, help="Only this schedule's dead letters."),
        click.option("--task", default=None, help="Only this task's dead letters."),
        click.option("--older-than", default=None, help="Dead for at least this long (e.g. 2h)."),
        click.option("--newer-than", default=None, help="Dead for at most this long (e.g. 1d)."),
    ]):
        func = option(func)
    return func


def _select(database_url, schema, schedule, task, older_than, newer_than, ids=None) -> tuple[Any, list[dict]]:
    from cronkeeper.cli.connect import open_database

    db = open_database(database_url, schema)
    return db, select_dead(db.engine, schedule, task, older_than, newer_than, ids)


@click.group("dlq")
def dlq_command() -> None:
    """Dead letters: jobs that failed permanently or ran out of attempts."""


@dlq_command.command("list")
@database_options
@filters
@click.option("--limit", type=click.IntRange(1, MAX_DOCUMENT), default=None,
              help=f"At most this many (a page; without it, the whole selection, refused past "
                   f"{MAX_DOCUMENT}).")
@click.option("--offset", type=click.IntRange(0), default=0, show_default=True,
              help="Skip this many of the oldest first (the next page).")
@format_option
def list_command(database_url, schema, cluster, schedule, task, older_than, newer_than, limit,
                 offset, fmt) -> None:
    """List dead letters, oldest first."""
    from cronkeeper.cli.connect import open_database

    db = open_database(database_url, schema)
    rows = listing(db.engine, choose(db.engine, schedule, task, older_than, newer_than), limit,
                   offset)
    if fmt == "json":
        click.echo(dumps(list_document(rows)))
        return
    if not rows:
        click.echo("no dead letters")
        return
    click.echo(f"{'ID':>8}  {'DEAD AT':20}  {'TASK':24}  {'ATT':>3}  KEY / LAST ERROR")
    for r in rows:
        click.echo(f"{r['id']:>8}  {(iso(r['dead_at']) or '')[:20]:20}  {safe(r['task'])[:24]:24}  "
                   f"{r['attempts']:>3}  {safe(r['idempotency_key'])}")
        click.echo(f"{'':>8}  {safe((r['last_error'] or '').partition(chr(10))[0])[:200]}")
    click.echo(f"{len(rows)} dead letter{'s' if len(rows) != 1 else ''}")


@dlq_command.command("show")
@database_options
@click.argument("job_id", type=int)
@format_option
def show_command(database_url, schema, cluster, job_id, fmt) -> None:
    """One dead letter: payload, last error, attempts."""
    db, rows = _select(database_url, schema, None, None, None, None, ids=[job_id])
    if not rows:
        raise CronkeeperError(f"no dead letter with id {job_id}")
    item = show_document(db.engine, rows[0])
    if fmt == "json":
        click.echo(dumps(item))
        return
    for key in ("id", "idempotency_key", "schedule", "task", "owner", "scheduled_for", "created_at",
                "dead_at", "attempts", "max_attempts"):
        click.echo(f"{key:16} {safe(item[key])}")
    # last_error may span lines: the error, then the tail of the last attempt's output.
    first, *rest = escape_text(item["last_error"] or "").split("\n")
    click.echo(f"{'last_error':16} {first}")
    for line in rest:
        click.echo(f"{'':16} {line}")
    click.echo(f"{'payload':16} {safe(json.dumps(item['payload']))}")
    for a in item["attempt_log"]:
        click.echo(f"  attempt {a['attempt']}: {a['outcome']} by {safe(a['worker_id'])} "
                   f"{a['started_at']} .. {a['finished_at']} {safe(a['error'] or '')}")


def _confirm(verb: str, chosen: DeadSelection, yes: bool) -> None:
    n = len(chosen.ids)
    summary = ", ".join(f"{safe(t)} ({k})" for t, k in chosen.tasks.items())
    click.echo(f"{verb} {n} dead letter{'s' if n != 1 else ''}: tasks {summary}")
    if verb == "replay":
        click.echo("replay re-executes real side effects (charges, emails, webhooks)")
    if yes:
        return
    if not sys.stdin.isatty():
        raise CronkeeperError(f"refusing to {verb} without confirmation: no terminal to ask on; "
                              "pass --yes to confirm from a script")
    if not click.confirm(f"{verb} these {n} jobs?", default=False):
        raise CronkeeperError(f"{verb} cancelled; nothing changed")


def _act(verb: str, database_url, schema, schedule, task, older_than, newer_than, ids, yes) -> None:
    from cronkeeper.cli.connect import open_database

    db = open_database(database_url, schema)
    # the whole selection, however many (ids and tasks, no error text), acted on by its ids:
    # exactly the jobs stated, less any replayed or discarded meanwhile
    chosen = selection(db.engine, choose(db.engine, schedule, task, older_than, newer_than,
                                         list(ids) or None))
    if not chosen.ids:
        click.echo(f"no dead letters match; nothing to {verb}")
        return
    _confirm(verb, chosen, yes)
    done = apply(db.engine, verb, chosen.ids)
    past = {"replay": "replayed", "discard": "discarded"}[verb]
    click.echo(f"{past} {len(done)} job{'s' if len(done) != 1 else ''}")


def _action_command(verb: str, doc: str):
    @dlq_command.command(verb, help=doc)
    @database_options
    @filters
    @click.argument("id_args", metavar="[ID]...", type=int, nargs=-1)
    @click.option("--id", "ids", type=int, multiple=True, help="Only this dead letter (repeatable).")
    @click.option("--yes", is_flag=True, help="Do not ask (for scripts).")
    def command(database_url, schema, cluster, schedule, task, older_than, newer_than, id_args,
                ids, yes):
        # `dlq replay 42 43` as `dlq show 42` takes it; --id kept for scripts that use it.
        chosen = tuple(dict.fromkeys((*id_args, *ids)))
        _act(verb, database_url, schema, schedule, task, older_than, newer_than, chosen, yes)

    return command


replay_command = _action_command("replay", "Make dead letters available again, due now, with a fresh attempt budget.")
discard_command = _action_command("discard", "Delete dead letters for good.")
