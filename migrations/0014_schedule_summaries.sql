-- oldest release: 0.1.0
-- cronkeeper schema, version 14: each schedule's figures kept by the leader (issue 27: `status`
-- on 10,000 schedules under a second; docs/observability.md, "Where status's figures come
-- from"). Additive: one table, which code older than this release never reads or writes.
--
-- schedule_summaries: per schedule in force, written by the leader's summarizer
-- (cronkeeper/summarizer.py) a batch of schedules per committed transaction, fenced by its term,
-- a pass every minute or so: the version the row was computed under (with the owner, timeout and
-- grace of that version), its next undecided fires (every fire after the decided period it
-- follows, up to a few minutes past computed_at, and two more), the audit's periods missing in
-- the hour before computed_at (how many, and the earliest 64 of them: a reader counts those
-- still within its own hour), and the run-time figures of its last 100 finished attempts. `status`, the web and the metrics read a row only while a leader leads, the
-- row is younger than their bound and its version is still in force; otherwise they compute that
-- schedule's figures themselves, as before.
CREATE TABLE schedule_summaries (
    schedule               text PRIMARY KEY,
    version_id             bigint NOT NULL,
    owner                  text,
    timeout_seconds        double precision NOT NULL,
    grace_seconds          double precision NOT NULL,
    decided_through        timestamptz NOT NULL,
    next_fires             timestamptz[] NOT NULL,
    missing_last_hour      integer,
    missing_first          timestamptz[] NOT NULL,
    duration_attempts      integer NOT NULL,
    duration_p50_seconds   double precision,
    duration_p99_seconds   double precision,
    attempts_timed_out_24h integer NOT NULL,
    term                   bigint NOT NULL,
    computed_at            timestamptz NOT NULL
);
