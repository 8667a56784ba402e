"""The one error of the timing package."""


class TimingError(ValueError):
    """A cron expression, duration, timezone or time argument is invalid.

    ``str(err)`` is a user-facing message, e.g. ``hour field: 25 is out of range 0-23``.
    """
