"""cronkeeper: distributed cron that writes exactly one job per period into a PostgreSQL outbox.

``cronkeeper.enqueue``, ``cronkeeper.enqueue_many``, ``cronkeeper.schedules`` (runtime schedules),
``cronkeeper.PermanentError`` and ``cronkeeper.ScheduleError`` load lazily, so ``import cronkeeper``
stays light (no SQLAlchemy or psycopg until they are used).
"""

from typing import Any

__version__ = "0.2.0.dev0"
__all__ = ["PermanentError", "ScheduleError", "__version__", "enqueue", "enqueue_many",
           "schedules"]


def __getattr__(name: str) -> Any:
    if name in ("enqueue", "enqueue_many"):
        from cronkeeper.db import enqueue

        return getattr(enqueue, name)
    if name == "schedules":
        import importlib

        return importlib.import_module("cronkeeper.schedules")
    if name in ("PermanentError", "ScheduleError"):
        from cronkeeper import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'cronkeeper' has no attribute {name!r}")
