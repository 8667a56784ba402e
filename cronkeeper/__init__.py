"""cronkeeper: distributed cron that writes exactly one job per period into a PostgreSQL outbox."""

__version__ = "0.1.0"
