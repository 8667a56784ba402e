-- oldest release: 0.1.0
-- cronkeeper schema, version 7: fewer index entries written per job (docs/worker.md, "Speed,
-- measured"). (0006 is taken by the burst work on another branch; 0003 and 0004 are reserved.)
-- Every claim and every ending is a non-HOT update of the job's row (its state is
-- in the partial indexes' predicates), so each writes an entry into every index whose
-- predicate the new row version satisfies; and each attempt row is inserted, then updated.

-- Jobs enqueued by applications have no schedule, and nothing looks them up by schedule: the
-- two by-schedule indexes leave them out (every query using them names a schedule, which
-- implies schedule IS NOT NULL, so the planner still proves them usable).
DROP INDEX outbox_unfinished_by_schedule;
CREATE INDEX outbox_unfinished_by_schedule ON outbox (schedule)
    WHERE state IN ('available', 'running') AND schedule IS NOT NULL;
DROP INDEX outbox_schedule_period;
CREATE INDEX outbox_schedule_period ON outbox (schedule, scheduled_for) WHERE schedule IS NOT NULL;

-- An attempt is inserted unfinished: only finished ones are looked up by finished_at (prune,
-- the failure-rate metric), so the unfinished ones need no entry.
DROP INDEX attempts_finished_at;
CREATE INDEX attempts_finished_at ON attempts (finished_at) WHERE finished_at IS NOT NULL;
