-- oldest release: 0.1.0
-- cronkeeper schema, version 1. Applied by `cronkeeper migrate` in one transaction, with
-- search_path set to the configured schema (so no object name here is schema-qualified).

CREATE TABLE instances (
    cluster            text NOT NULL,
    instance_id        text NOT NULL,
    kind               text NOT NULL CHECK (kind IN ('scheduler', 'worker')),
    host               text NOT NULL,
    pid                integer NOT NULL,
    version            text NOT NULL,
    schedules_digest   text NOT NULL,
    tzdata_version     text NOT NULL,
    role               text NOT NULL DEFAULT 'standby' CHECK (role IN ('leader', 'standby', 'worker')),
    started_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    heartbeat_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    clock_skew_seconds double precision,
    PRIMARY KEY (cluster, instance_id)
);

-- One row per cluster: the current leader and its term (fencing token).
CREATE TABLE leadership (
    cluster       text PRIMARY KEY,
    term          bigint NOT NULL,
    instance_id   text NOT NULL,
    backend_pid   integer NOT NULL,
    since         timestamptz NOT NULL,
    heartbeat_at  timestamptz NOT NULL,
    released_at   timestamptz
);

-- Every version of every schedule, kept so audits judge each period by the spec in force.
-- A row with spec NULL records the schedule's removal at active_from.
CREATE TABLE schedule_versions (
    id           bigserial PRIMARY KEY,
    schedule     text NOT NULL,
    digest       text NOT NULL,
    spec         jsonb,
    active_from  timestamptz NOT NULL,
    term         bigint NOT NULL,
    UNIQUE (schedule, active_from)
);

-- Operator controls (pause/resume). Periods due while paused are recorded as skipped (paused).
CREATE TABLE schedule_controls (
    schedule    text PRIMARY KEY,
    paused      boolean NOT NULL,
    changed_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    changed_by  text NOT NULL
);

-- The per-period lock: one outcome per (schedule, scheduled_for), decided once.
CREATE TABLE periods (
    schedule       text NOT NULL,
    scheduled_for  timestamptz NOT NULL,
    version_id     bigint NOT NULL REFERENCES schedule_versions (id),
    outcome        text NOT NULL CHECK (outcome IN ('emitted', 'skipped')),
    reason         text CHECK (reason IN ('misfire', 'overlap', 'paused', 'coalesced', 'backfill')),
    decided_at     timestamptz NOT NULL DEFAULT now(),
    term           bigint NOT NULL,
    PRIMARY KEY (schedule, scheduled_for),
    CHECK ((outcome = 'skipped') = (coalesce(reason, 'backfill') <> 'backfill'))
);
CREATE INDEX periods_decided_at ON periods (decided_at);

-- The outbox: a public interface (docs/outbox.md documents every column).
CREATE TABLE outbox (
    id                bigserial PRIMARY KEY,
    idempotency_key   text NOT NULL UNIQUE,
    schedule          text,
    scheduled_for     timestamptz,
    version_id        bigint REFERENCES schedule_versions (id),
    task              text NOT NULL,
    payload           jsonb NOT NULL DEFAULT '{}'::jsonb,
    state             text NOT NULL DEFAULT 'available'
                      CHECK (state IN ('available', 'running', 'succeeded', 'dead', 'published')),
    attempts          integer NOT NULL DEFAULT 0,
    max_attempts      integer NOT NULL DEFAULT 5 CHECK (max_attempts >= 1),
    run_after         timestamptz NOT NULL DEFAULT now(),
    created_at        timestamptz NOT NULL DEFAULT now(),
    timeout_seconds   double precision NOT NULL DEFAULT 600,
    backoff           jsonb NOT NULL DEFAULT '{"base": 30, "factor": 2, "max": 3600}'::jsonb,
    serial            boolean NOT NULL DEFAULT false,
    owner             text,
    leased_by         text,
    lease_expires_at  timestamptz,
    last_error        text,
    finished_at       timestamptz
);
CREATE INDEX outbox_available ON outbox (run_after, id) WHERE state = 'available';
CREATE INDEX outbox_running_lease ON outbox (lease_expires_at) WHERE state = 'running';
CREATE INDEX outbox_unfinished_by_schedule ON outbox (schedule)
    WHERE state IN ('available', 'running');
CREATE INDEX outbox_finished ON outbox (finished_at) WHERE state IN ('succeeded', 'published');
CREATE INDEX outbox_dead ON outbox (finished_at) WHERE state = 'dead';
CREATE INDEX outbox_schedule_period ON outbox (schedule, scheduled_for);

-- Every attempt of every job: worker, start, end, outcome, error.
CREATE TABLE attempts (
    id           bigserial PRIMARY KEY,
    job_id       bigint NOT NULL REFERENCES outbox (id) ON DELETE CASCADE,
    attempt      integer NOT NULL,
    worker_id    text NOT NULL,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz,
    outcome      text CHECK (outcome IN ('succeeded', 'retry', 'dead', 'timeout', 'lease_expired', 'released')),
    error        text,
    UNIQUE (job_id, attempt)
);
CREATE INDEX attempts_finished_at ON attempts (finished_at);

-- Effects claimed once by handlers (cronkeeper.worker idempotency helper).
CREATE TABLE effects (
    key         text PRIMARY KEY,
    job_key     text,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- Retention. SECURITY DEFINER so the scheduler's role needs EXECUTE on this, not DELETE on tables.
-- Deletes at most batch_size rows of each kind per call; the leader calls it between ticks.
CREATE FUNCTION prune(jobs_before timestamptz, periods_before timestamptz, batch_size integer)
RETURNS TABLE (jobs bigint, attempts bigint, periods bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    n_jobs bigint; n_attempts bigint; n_periods bigint;
BEGIN
    DELETE FROM attempts WHERE id IN (
        SELECT id FROM attempts WHERE finished_at < jobs_before ORDER BY finished_at LIMIT batch_size);
    GET DIAGNOSTICS n_attempts = ROW_COUNT;
    DELETE FROM outbox WHERE id IN (
        SELECT id FROM outbox WHERE state IN ('succeeded', 'published') AND finished_at < jobs_before
        ORDER BY finished_at LIMIT batch_size);
    GET DIAGNOSTICS n_jobs = ROW_COUNT;
    DELETE FROM periods WHERE (schedule, scheduled_for) IN (
        SELECT schedule, scheduled_for FROM periods WHERE decided_at < periods_before
        ORDER BY decided_at LIMIT batch_size);
    GET DIAGNOSTICS n_periods = ROW_COUNT;
    RETURN QUERY SELECT n_jobs, n_attempts, n_periods;
END;
$$;
