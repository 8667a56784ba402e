-- oldest release: 0.1.0
-- cronkeeper schema, version 5: `cronkeeper relay` (SPEC §11; docs/relay.md).
-- (0002 was already taken on main by the worker's serial index; 0003 and 0004 are reserved for
-- other work, so the relay takes the next free number.)

-- Where a relay handed a job on: when, to which configured target, and its id there.
ALTER TABLE outbox ADD COLUMN published_at timestamptz;
ALTER TABLE outbox ADD COLUMN published_to text;
ALTER TABLE outbox ADD COLUMN target_id text;

-- A relay's attempt ends as `published` (the job was handed on, not run).
ALTER TABLE attempts DROP CONSTRAINT attempts_outcome_check;
ALTER TABLE attempts ADD CONSTRAINT attempts_outcome_check CHECK (outcome IN
    ('succeeded', 'retry', 'dead', 'timeout', 'lease_expired', 'released', 'published'));

-- Relays register as instances (kind and role 'relay'), so status and metrics show them.
ALTER TABLE instances DROP CONSTRAINT instances_kind_check;
ALTER TABLE instances ADD CONSTRAINT instances_kind_check CHECK (kind IN ('scheduler', 'worker', 'relay'));
ALTER TABLE instances DROP CONSTRAINT instances_role_check;
ALTER TABLE instances ADD CONSTRAINT instances_role_check
    CHECK (role IN ('leader', 'standby', 'worker', 'relay'));

-- Relays register here, as they start, the routes of their config: workers never claim a job a
-- registered route matches (it stays for a relay), whether or not a relay is running right now.
-- The globs are kept as written; the regexes (PostgreSQL ARE, anchored) are what claims match.
CREATE TABLE relay_routes (
    relay           text NOT NULL,
    position        integer NOT NULL,
    target          text NOT NULL,
    tasks           text[],
    schedules       text[],
    task_regex      text,
    schedule_regex  text,
    registered_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (relay, position)
);

-- Published jobs the target has not reported finished: overlap (skip, serial) counts them as
-- running until their timeout has passed since publication; the relay polls their status.
CREATE INDEX outbox_published_open ON outbox (schedule, published_at)
    WHERE state = 'published' AND finished_at IS NULL;
CREATE INDEX outbox_published_unreported ON outbox (published_at)
    WHERE state = 'published' AND finished_at IS NULL;

-- Retention also reaches published jobs whose outcome the target never reported.
CREATE OR REPLACE FUNCTION prune(jobs_before timestamptz, periods_before timestamptz, batch_size integer)
RETURNS TABLE (jobs bigint, attempts bigint, periods bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    n_jobs bigint; n_unreported bigint; n_attempts bigint; n_periods bigint;
BEGIN
    DELETE FROM attempts WHERE id IN (
        SELECT id FROM attempts WHERE finished_at < jobs_before ORDER BY finished_at LIMIT batch_size);
    GET DIAGNOSTICS n_attempts = ROW_COUNT;
    DELETE FROM outbox WHERE id IN (
        SELECT id FROM outbox WHERE state IN ('succeeded', 'published') AND finished_at < jobs_before
        ORDER BY finished_at LIMIT batch_size);
    GET DIAGNOSTICS n_jobs = ROW_COUNT;
    DELETE FROM outbox WHERE id IN (
        SELECT id FROM outbox WHERE state = 'published' AND finished_at IS NULL
          AND published_at < jobs_before
        ORDER BY published_at LIMIT batch_size);
    GET DIAGNOSTICS n_unreported = ROW_COUNT;
    DELETE FROM periods WHERE (schedule, scheduled_for) IN (
        SELECT schedule, scheduled_for FROM periods WHERE decided_at < periods_before
        ORDER BY decided_at LIMIT batch_size);
    GET DIAGNOSTICS n_periods = ROW_COUNT;
    RETURN QUERY SELECT n_jobs + n_unreported, n_attempts, n_periods;
END;
$$;
