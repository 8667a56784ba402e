"""Entry point. Commands load lazily so that `validate` and `next` stay fast and database-free."""

from __future__ import annotations

import importlib
import os

import click

from cronkeeper import __version__
from cronkeeper.errors import CronkeeperError

# name -> module under cronkeeper.cli exporting `command`
COMMANDS = {
    "validate": "validate",
    "next": "next_cmd",
    "migrate": "migrate",
    "run": "run",
    "status": "status",
    "pause": "control",
    "resume": "control",
    "trigger": "control",
    "backfill": "control",
    "worker": "worker",
    "relay": "relay",
    "dlq": "dlq",
    "explain": "explain",
    "output": "output",
    "history": "history",
    "import": "import_cmd",
    "web": "web",
    "schedules": "schedules_cmd",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = COMMANDS.get(cmd_name)
        if module_name is None:
            return None
        module = importlib.import_module(f"cronkeeper.cli.{module_name}")
        return getattr(module, cmd_name.replace("-", "_") + "_command")


    def invoke(self, ctx: click.Context):
        """Map cronkeeper's errors to a message and an exit code; never show a traceback."""
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except CronkeeperError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            ctx.exit(130)
        except Exception as exc:  # the last line of defence: a message, never a traceback
            if os.environ.get("CRONKEEPER_DEBUG"):
                raise
            click.echo(
                f"internal error: {type(exc).__name__}: {exc} "
                "(this is a bug in cronkeeper; set CRONKEEPER_DEBUG=1 for a traceback)",
                err=True,
            )
            ctx.exit(70)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cronkeeper")
def cli() -> None:
    """cronkeeper: distributed cron that writes exactly one job per period into an outbox."""


def main() -> None:
    cli(prog_name="cronkeeper")
