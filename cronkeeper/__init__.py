"""cronkeeper: distributed cron that writes exactly one job per period into a PostgreSQL outbox.

``cronkeeper.enqueue``, ``cronkeeper.enqueue_many`` and ``cronkeeper.PermanentError`` load lazily, so ``import cronkeeper``
stays light (no SQLAlchemy or psycopg until they are used).
"""

from typing import Any

__version__ = "0.2.0.dev0"
__all__ = ["PermanentError", "__version__", "enqueue", "enqueue_many"]


def __getattr__(name: str) -> Any:
    if name in ("enqueue", "enqueue_many"):
        from cronkeeper.db import enqueue

        return getattr(enqueue, name)
    if name == "PermanentError":
        from cronkeeper.errors import PermanentError

        return PermanentError
    raise AttributeError(f"module 'cronkeeper' has no attribute {name!r}")
