"""`cronkeeper import`: crontabs and Celery beat schedules -> schedule files (docs/import.md).

- :mod:`crontab` reads a crontab (user, ``/etc/crontab``, ``/etc/cron.d``) as cronie does; pure.
- :mod:`celerybeat` imports a Celery app and reads its ``beat_schedule``.
- :mod:`render` turns converted entries into TOML, checks them with the schedule validator, and
  is stable: the same input gives the same bytes.
- :mod:`compare` puts the old system's fires beside cronkeeper's (:mod:`cronie` simulates
  cronie's daemon loop independently of cronkeeper's trigger code; Celery's own ``is_due`` is run
  for beat entries).

Imports nothing from cronkeeper.db, cronkeeper.worker or cronkeeper.cli.
"""

from cronkeeper.importing.model import Conversion, Entry, Problem

__all__ = ["Conversion", "Entry", "Problem"]
