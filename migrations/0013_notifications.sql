-- oldest release: 0.1.0
-- cronkeeper schema, version 13: being told (issue 24; docs/notifications.md). Additive: two
-- tables and a function, which code older than this release never reads or writes.
--
-- notifications: the events a person is told about (a dead letter, missed periods, a missing
-- period, a recovery), each written by the transaction that records the event itself, then sent
-- by whichever `cronkeeper run` or `cronkeeper worker` holds a notify config: an outbox of its
-- own, claimed FOR UPDATE SKIP LOCKED under a lease, retried with backoff. A sink the event was
-- delivered to is in sent_to (written as soon as it answered), one that refused it for good in
-- failed_to, so a retry sends only to the others. No foreign key to outbox: a dead letter may be
-- discarded, or a job pruned, before its notification is sent, and the notification stands.
CREATE TABLE notifications (
    id                bigserial PRIMARY KEY,
    event             text NOT NULL CHECK (event IN ('dead', 'missed', 'missing', 'recovered')),
    schedule          text,
    task              text,
    owner             text,
    job_id            bigint,
    key               text,
    attempts          integer,
    error             text,
    count             integer NOT NULL DEFAULT 1,
    window_from       timestamptz,
    window_until      timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    state             text NOT NULL DEFAULT 'pending'
                      CHECK (state IN ('pending', 'sending', 'sent', 'failed')),
    tries             integer NOT NULL DEFAULT 0,
    run_after         timestamptz NOT NULL DEFAULT now(),
    leased_by         text,
    lease_expires_at  timestamptz,
    sent_to           text[] NOT NULL DEFAULT '{}',
    failed_to         text[] NOT NULL DEFAULT '{}',
    last_error        text,
    finished_at       timestamptz
);
CREATE INDEX notifications_pending ON notifications (run_after, id) WHERE state = 'pending';
CREATE INDEX notifications_sending ON notifications (lease_expires_at) WHERE state = 'sending';
CREATE INDEX notifications_finished ON notifications (finished_at) WHERE state IN ('sent', 'failed');

-- What keeps a flood of dead letters to one message: per schedule (kind 'schedule') or, for a
-- job without one, per task (kind 'task'), the dead letters since the `dead` notification that
-- was sent for it (the first of them included; 0: none since the last recovery). Updated by
-- the very statements that dead-letter a job or complete one (row locks taken in (kind, name)
-- order, so concurrent workers never deadlock on them). suppressed_total counts, for good, the
-- dead letters that were counted instead of sent (cronkeeper_notifications_suppressed_total).
-- missing_through: the latest missing period of the schedule already notified (the leader's
-- audit tells each missing period once).
CREATE TABLE notification_subjects (
    kind              text NOT NULL CHECK (kind IN ('schedule', 'task')),
    name              text NOT NULL,
    dead_letters      integer NOT NULL DEFAULT 0,
    dead_since        timestamptz,
    suppressed_total  bigint NOT NULL DEFAULT 0,
    missing_through   timestamptz,
    PRIMARY KEY (kind, name)
);
-- The subjects that are dead now: what every completion looks its schedules up in (few entries
-- however many schedules once died and recovered).
CREATE INDEX notification_subjects_dead ON notification_subjects (kind, name)
    WHERE dead_letters > 0;

-- Retention for notifications, as prune() is for jobs: SECURITY DEFINER so the scheduler's role
-- needs EXECUTE on it, not DELETE. Removes, at most batch_size at a time, notifications that
-- ended (sent or failed) before `before`, and pending ones written before it that nobody ever
-- tried to send (no process of the cluster has a notify config).
CREATE FUNCTION notifications_prune(before timestamptz, batch_size integer)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    ended bigint; unsent bigint;
BEGIN
    DELETE FROM notifications WHERE id IN (
        SELECT id FROM notifications WHERE state IN ('sent', 'failed') AND finished_at < before
        ORDER BY finished_at LIMIT batch_size);
    GET DIAGNOSTICS ended = ROW_COUNT;
    DELETE FROM notifications WHERE id IN (
        SELECT id FROM notifications WHERE state = 'pending' AND tries = 0 AND run_after < before
        ORDER BY run_after LIMIT batch_size);
    GET DIAGNOSTICS unsent = ROW_COUNT;
    RETURN ended + unsent;
END;
$$;
