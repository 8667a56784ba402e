-- oldest release: 0.1.0
-- cronkeeper schema, version 15: schedules defined at runtime (issue 22; SPEC §15;
-- docs/runtime-schedules.md). Additive: two tables and a nullable column, which code
-- older than this release never reads or writes.
--
-- runtime_schedules: the runtime schedules as the applications' transactions left them
-- (cronkeeper.schedules.put / put_many / sync / delete), one row per name. The leader adopts
-- what changed (rows written by transactions it had not seen end) by recording a version in
-- schedule_versions, with the id the put gave out (`version_id`, drawn from that table's own
-- sequence), so every version in force is kept and `history` judges each period by it.
--   spec          the mapping as the application gave it (get / list / schedules show)
--   canonical     the validated spec as a schedule version stores it (ScheduleSpec.to_json)
--   digest        the digest of `canonical`: a put of an unchanged spec writes nothing
--   incarnation   the version id of the put that created (or revived) the name: a delete and a
--                 new put of the same name are two schedules, and the claim's fence tells them
--                 apart
--   xid           the transaction that last wrote the row: the leader reads again every row
--                 whose writer was not yet known to have ended at its last look (xid at or above
--                 that look's snapshot xmin), so a transaction that commits late, after one that
--                 wrote later, is never passed over (a sequence would be, committed out of order)
--   deleted_at    a delete is a tombstone (kept, so the leader learns of it like any write)
--
-- The fence (docs/runtime-schedules.md, "Deletes are fenced"): the leader's claim of a runtime
-- schedule's periods locks its row FOR KEY SHARE SKIP LOCKED, in the claim's own transaction,
-- and emits nothing for a row it did not get (deleted, or being deleted). A delete sets
-- deleted_at, a column of the unique index below: changing it makes the UPDATE take the row's
-- FOR UPDATE lock, the only one FOR KEY SHARE waits for, so a delete waits for a claim in
-- flight and a claim never passes an uncommitted delete. A put that changes a spec leaves
-- deleted_at as it is, takes the weaker FOR NO KEY UPDATE, and never holds a claim up.
CREATE TABLE runtime_schedules (
    name          text PRIMARY KEY,
    spec          jsonb NOT NULL,
    canonical     jsonb NOT NULL,
    digest        text NOT NULL,
    version_id    bigint NOT NULL,
    incarnation   bigint NOT NULL,
    xid           xid8 NOT NULL DEFAULT pg_current_xact_id(),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    deleted_at    timestamptz
);
-- Makes deleted_at a key column (see above); the primary key already makes names unique.
CREATE UNIQUE INDEX runtime_schedules_fence ON runtime_schedules (name, deleted_at);
-- The leader's poll: the rows written by transactions that had not ended at its last look.
CREATE INDEX runtime_schedules_xid ON runtime_schedules (xid);

-- Where a version came from: 'runtime' (cronkeeper.schedules), 'file:<path>' (the schedule file
-- that defined it when the leader recorded it), NULL (recorded before this release: a file).
ALTER TABLE schedule_versions ADD COLUMN origin text;

-- The calendars the schedule files define ([calendars.NAME]), as the leader recorded them when it
-- adopted the file set: what a runtime spec's `calendar = "NAME"` resolves against (the files
-- live on the daemons' hosts, not in the database). A put stores the dates it resolved in its
-- version, as a file schedule's version holds them. removed_at: no longer in the files.
CREATE TABLE calendars (
    name          text PRIMARY KEY,
    dates         jsonb NOT NULL,
    origin        text,
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    removed_at    timestamptz,
    term          bigint NOT NULL
);

-- Retention for tombstones, as prune() is for jobs: SECURITY DEFINER so the scheduler's role
-- needs EXECUTE on it, not DELETE. Removes, at most batch_size at a time, runtime schedules
-- deleted before `before` whose removal a leader has recorded (their newest version is a
-- removal): a tombstone no leader has adopted yet is kept, whatever its age.
CREATE FUNCTION runtime_schedules_prune(before timestamptz, batch_size integer)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    pruned bigint;
BEGIN
    DELETE FROM runtime_schedules WHERE name IN (
        SELECT r.name FROM runtime_schedules r
        WHERE r.deleted_at < before
          AND (SELECT v.spec IS NULL FROM schedule_versions v WHERE v.schedule = r.name
               ORDER BY v.active_from DESC, v.id DESC LIMIT 1)
        ORDER BY r.deleted_at LIMIT batch_size);
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END;
$$;
