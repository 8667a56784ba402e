"""Table definitions: the one schema truth in Python, checked against the migrations by a test.

Tables carry no schema: connections resolve them through search_path (see engine.make_engine).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.dialects.postgresql.base import ischema_names

metadata = sa.MetaData()
TS = sa.TIMESTAMP(timezone=True)


class XID8(sa.types.UserDefinedType):
    """PostgreSQL's 64-bit transaction id (migrations/0015_runtime_schedules.sql)."""

    cache_ok = True

    def get_col_spec(self, **kw: object) -> str:
        return "XID8"


ischema_names["xid8"] = XID8  # what reflection (tests/test_migrations.py) reads it back as

instances = sa.Table(
    "instances", metadata,
    sa.Column("cluster", sa.Text, primary_key=True),
    sa.Column("instance_id", sa.Text, primary_key=True),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("version", sa.Text, nullable=False),
    sa.Column("schedules_digest", sa.Text, nullable=False),
    sa.Column("tzdata_version", sa.Text, nullable=False),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("started_at", TS, nullable=False),
    sa.Column("heartbeat_at", TS, nullable=False),
    sa.Column("clock_skew_seconds", sa.Double),
)

leadership = sa.Table(
    "leadership", metadata,
    sa.Column("cluster", sa.Text, primary_key=True),
    sa.Column("term", sa.BigInteger, nullable=False),
    sa.Column("instance_id", sa.Text, nullable=False),
    sa.Column("backend_pid", sa.Integer, nullable=False),
    sa.Column("since", TS, nullable=False),
    sa.Column("heartbeat_at", TS, nullable=False),
    sa.Column("released_at", TS),
)

schedule_versions = sa.Table(
    "schedule_versions", metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("schedule", sa.Text, nullable=False),
    sa.Column("digest", sa.Text, nullable=False),
    sa.Column("spec", JSONB),
    sa.Column("active_from", TS, nullable=False),
    sa.Column("term", sa.BigInteger, nullable=False),
    # migrations/0015_runtime_schedules.sql: 'runtime', 'file:<path>', NULL (an older release's)
    sa.Column("origin", sa.Text),
)

# migrations/0015_runtime_schedules.sql: schedules defined at runtime (cronkeeper.schedules)
runtime_schedules = sa.Table(
    "runtime_schedules", metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("spec", JSONB, nullable=False),
    sa.Column("canonical", JSONB, nullable=False),
    sa.Column("digest", sa.Text, nullable=False),
    sa.Column("version_id", sa.BigInteger, nullable=False),
    sa.Column("incarnation", sa.BigInteger, nullable=False),
    sa.Column("xid", XID8, nullable=False),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("updated_at", TS, nullable=False),
    sa.Column("deleted_at", TS),
)

# migrations/0015_runtime_schedules.sql: the files' calendars, for runtime specs to name
calendars = sa.Table(
    "calendars", metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("dates", JSONB, nullable=False),
    sa.Column("origin", sa.Text),
    sa.Column("recorded_at", TS, nullable=False),
    sa.Column("removed_at", TS),
    sa.Column("term", sa.BigInteger, nullable=False),
)

schedule_controls = sa.Table(
    "schedule_controls", metadata,
    sa.Column("schedule", sa.Text, primary_key=True),
    sa.Column("paused", sa.Boolean, nullable=False),
    sa.Column("changed_at", TS, nullable=False),
    sa.Column("changed_by", sa.Text, nullable=False),
)

# migrations/0016_schedule_pauses.sql: each span a schedule was paused, [paused_at, resumed_at)
schedule_pauses = sa.Table(
    "schedule_pauses", metadata,
    sa.Column("schedule", sa.Text, primary_key=True),
    sa.Column("paused_at", TS, primary_key=True),
    sa.Column("resumed_at", TS),
)

periods = sa.Table(
    "periods", metadata,
    sa.Column("schedule", sa.Text, primary_key=True),
    sa.Column("scheduled_for", TS, primary_key=True),
    sa.Column("version_id", sa.BigInteger, nullable=False),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("reason", sa.Text),
    sa.Column("decided_at", TS, nullable=False),
    sa.Column("term", sa.BigInteger, nullable=False),
)

outbox = sa.Table(
    "outbox", metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("idempotency_key", sa.Text, nullable=False, unique=True),
    sa.Column("schedule", sa.Text),
    sa.Column("scheduled_for", TS),
    sa.Column("version_id", sa.BigInteger),
    sa.Column("task", sa.Text, nullable=False),
    sa.Column("payload", JSONB, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("max_attempts", sa.Integer, nullable=False),
    sa.Column("run_after", TS, nullable=False),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("timeout_seconds", sa.Double, nullable=False),
    sa.Column("backoff", JSONB, nullable=False),
    sa.Column("serial", sa.Boolean, nullable=False),
    sa.Column("owner", sa.Text),
    sa.Column("leased_by", sa.Text),
    sa.Column("lease_expires_at", TS),
    sa.Column("last_error", sa.Text),
    sa.Column("finished_at", TS),
    # migrations/0005_relay.sql: where a relay handed the job on
    sa.Column("published_at", TS),
    sa.Column("published_to", sa.Text),
    sa.Column("target_id", sa.Text),
)

attempts = sa.Table(
    "attempts", metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("job_id", sa.BigInteger, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("worker_id", sa.Text, nullable=False),
    sa.Column("started_at", TS, nullable=False),
    sa.Column("finished_at", TS),
    sa.Column("outcome", sa.Text),
    sa.Column("error", sa.Text),
    # migrations/0010_attempt_output.sql: what the attempt printed (cronkeeper.output)
    sa.Column("output", sa.LargeBinary),
)

effects = sa.Table(
    "effects", metadata,
    sa.Column("key", sa.Text, primary_key=True),
    sa.Column("job_key", sa.Text),
    sa.Column("created_at", TS, nullable=False),
)

relay_routes = sa.Table(
    "relay_routes", metadata,
    sa.Column("relay", sa.Text, primary_key=True),
    sa.Column("position", sa.Integer, primary_key=True),
    sa.Column("target", sa.Text, nullable=False),
    sa.Column("tasks", sa.ARRAY(sa.Text)),
    sa.Column("schedules", sa.ARRAY(sa.Text)),
    sa.Column("task_regex", sa.Text),
    sa.Column("schedule_regex", sa.Text),
    sa.Column("registered_at", TS, nullable=False),
)

# migrations/0013_notifications.sql: what a person is told (docs/notifications.md)
notifications = sa.Table(
    "notifications", metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("event", sa.Text, nullable=False),
    sa.Column("schedule", sa.Text),
    sa.Column("task", sa.Text),
    sa.Column("owner", sa.Text),
    sa.Column("job_id", sa.BigInteger),
    sa.Column("key", sa.Text),
    sa.Column("attempts", sa.Integer),
    sa.Column("error", sa.Text),
    sa.Column("count", sa.Integer, nullable=False),
    sa.Column("window_from", TS),
    sa.Column("window_until", TS),
    sa.Column("created_at", TS, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("tries", sa.Integer, nullable=False),
    sa.Column("run_after", TS, nullable=False),
    sa.Column("leased_by", sa.Text),
    sa.Column("lease_expires_at", TS),
    sa.Column("sent_to", sa.ARRAY(sa.Text), nullable=False),
    sa.Column("failed_to", sa.ARRAY(sa.Text), nullable=False),
    sa.Column("last_error", sa.Text),
    sa.Column("finished_at", TS),
)

notification_subjects = sa.Table(
    "notification_subjects", metadata,
    sa.Column("kind", sa.Text, primary_key=True),
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("dead_letters", sa.Integer, nullable=False),
    sa.Column("dead_since", TS),
    sa.Column("suppressed_total", sa.BigInteger, nullable=False),
    sa.Column("missing_through", TS),
)

# The leader's per-schedule figures (migrations/0014; db/schedule_summaries.py).
schedule_summaries = sa.Table(
    "schedule_summaries", metadata,
    sa.Column("schedule", sa.Text, primary_key=True),
    sa.Column("version_id", sa.BigInteger, nullable=False),
    sa.Column("owner", sa.Text),
    sa.Column("timeout_seconds", sa.Double, nullable=False),
    sa.Column("grace_seconds", sa.Double, nullable=False),
    sa.Column("decided_through", TS, nullable=False),
    sa.Column("next_fires", sa.ARRAY(TS), nullable=False),
    sa.Column("missing_last_hour", sa.Integer),
    sa.Column("missing_first", sa.ARRAY(TS), nullable=False),
    sa.Column("duration_attempts", sa.Integer, nullable=False),
    sa.Column("duration_p50_seconds", sa.Double),
    sa.Column("duration_p99_seconds", sa.Double),
    sa.Column("attempts_timed_out_24h", sa.Integer, nullable=False),
    sa.Column("term", sa.BigInteger, nullable=False),
    sa.Column("computed_at", TS, nullable=False),
)

schema_migrations = sa.Table(
    "schema_migrations", metadata,
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("applied_at", TS, nullable=False),
    sa.Column("oldest_release", sa.Text),  # docs/upgrading.md; NULL on rows 0.1.0 wrote
)

# Indexes the worker relies on (migrations/0002_worker_serial_index.sql).
sa.Index(
    "outbox_available_serial", outbox.c.schedule, outbox.c.run_after,
    postgresql_where=sa.text("state = 'available' AND serial"),
)
# Timed-out attempts only: each schedule's timeouts of the last 24 hours (db/attempts.py,
# attempts_runtimes; migrations/0009_attempts_timed_out.sql).
sa.Index(
    "attempts_timed_out", attempts.c.finished_at,
    postgresql_where=sa.text("outcome = 'timeout'"),
)
# The subjects dead now: what each completion looks its schedules up in (db/notifications.py;
# migrations/0013_notifications.sql).
sa.Index(
    "notification_subjects_dead", notification_subjects.c.kind, notification_subjects.c.name,
    postgresql_where=sa.text("dead_letters > 0"),
)
# The open spans, one a schedule, and the resumed ones by when (db/schedule_pauses.py;
# migrations/0016_schedule_pauses.sql).
sa.Index(
    "schedule_pauses_open", schedule_pauses.c.schedule, unique=True,
    postgresql_where=sa.text("resumed_at IS NULL"),
)
sa.Index(
    "schedule_pauses_resumed", schedule_pauses.c.resumed_at,
    postgresql_where=sa.text("resumed_at IS NOT NULL"),
)
