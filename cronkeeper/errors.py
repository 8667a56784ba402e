"""The one exception tree. The CLI maps each class to a message and an exit code."""


class CronkeeperError(Exception):
    """Base of every error cronkeeper raises on purpose. ``str(err)`` is the user-facing message."""

    exit_code = 1


class UsageError(CronkeeperError):
    exit_code = 2


class UnusableInput(CronkeeperError):
    """`cronkeeper import` cannot read its input at all (not text, a directory, a module that
    fails to import): nothing is written (docs/import.md)."""

    exit_code = 2


class ScheduleError(CronkeeperError):
    """Schedule files (or runtime specs, ``cronkeeper.schedules``) are invalid; ``diagnostics``
    lists every problem, ``problems`` the same as ``{"schedule", "message"}`` mappings."""

    def __init__(self, message: str, diagnostics: list | None = None) -> None:
        super().__init__(message)
        self.diagnostics = diagnostics or []

    @property
    def problems(self) -> list[dict[str, str | None]]:
        """Every error, each ``{"schedule": name or None, "message": text}``: the messages
        ``cronkeeper validate`` prints."""
        return [{"schedule": d.schedule, "message": d.message} for d in self.diagnostics
                if str(getattr(d, "severity", "error")) == "error"]


class UnreadableVersion(CronkeeperError, ValueError):
    """A stored schedule version cannot be read back (written by another cronkeeper, checked
    against another tzdata, or edited by hand)."""


class DatabaseError(CronkeeperError):
    """The database could not be reached or refused a statement (message carries no password)."""


class SchemaIncompatible(DatabaseError):
    """The schema and this release of cronkeeper cannot work together (docs/upgrading.md)."""


class SchemaBehind(SchemaIncompatible):
    """The schema is older than this release of cronkeeper needs: run ``cronkeeper migrate``."""


class SchemaAhead(SchemaIncompatible):
    """The schema was migrated by a release that this one cannot work with: upgrade this host."""


class PoolerDetected(DatabaseError):
    """The lock connection does not keep one backend across transactions."""


class LeadershipLost(CronkeeperError):
    """This instance is no longer the leader: it must not write another period."""


class PermanentError(CronkeeperError):
    """Raised by a task handler for a failure that no retry can fix: dead-letter at once."""
