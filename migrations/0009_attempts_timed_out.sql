-- oldest release: 0.1.0
-- cronkeeper schema, version 9: timed-out attempts found without reading every attempt (issue
-- 27: each schedule's attempts timed out in the last 24 hours, in `status`, `web` and the
-- metrics). Additive: one partial index. Only timed-out attempts have an entry, so the attempts
-- that end otherwise (nearly all) write nothing more, and the count reads only the timeouts of
-- the last day, where `attempts_finished_at` would read every attempt of the day.
CREATE INDEX attempts_timed_out ON attempts (finished_at) WHERE outcome = 'timeout';
