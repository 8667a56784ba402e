-- oldest release: 0.1.0
-- cronkeeper schema, version 11: a period on a date its schedule's calendar lists is recorded
-- as skipped with reason 'calendar' (issue 25; docs/schedules.md, "Calendars"). A widened check
-- only: 0.1.0 works with it (docs/upgrading.md), and reads a 'calendar' row as any skipped
-- period (its `history` prints the reason as stored).
--
-- NOT VALID: the new check holds for every row written from now on, and the rows already there
-- passed the narrower check it replaces, so they satisfy this one. Validating would scan the
-- whole periods table (a year of periods) under this migration's exclusive lock, stopping the
-- leader's claims meanwhile; a later release may VALIDATE it outside a migration's lock.
ALTER TABLE periods DROP CONSTRAINT periods_reason_check;
ALTER TABLE periods ADD CONSTRAINT periods_reason_check
    CHECK (reason IN ('misfire', 'overlap', 'paused', 'coalesced', 'backfill', 'calendar'))
    NOT VALID;
