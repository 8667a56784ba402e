"""The RQ side of benchmarks/isolation_overhead.py: a no-op job function in a module with
nothing to import, so each forked work horse pays for the fork, not for imports (RQ's docs:
preload what jobs need before the fork)."""


def noop() -> None:
    return None
