-- oldest release: 0.1.0
-- cronkeeper schema, version 6: a burst of periods costs the server less (issue 14).
-- (0003 and 0004 are reserved for other work; 0005 is the relay's.)

-- The two foreign keys to schedule_versions were checked row by row: a lookup and a row lock on
-- the version for every period and every job, about a quarter of the server's work in a burst.
-- Every writer takes its version ids from schedule_versions itself (the leader from the rows it
-- recorded or read back, backfill and trigger from the version in force), and versions are
-- only ever added, so an id once read stays valid: what the keys still guarded was the
-- deletion of a version that periods or jobs name. The trigger below refuses that, as the keys
-- did (SQLSTATE 23503), at the cost of a lock only when a version is deleted or renumbered.
ALTER TABLE periods DROP CONSTRAINT periods_version_id_fkey;
ALTER TABLE outbox DROP CONSTRAINT outbox_version_id_fkey;

CREATE FUNCTION schedule_versions_keep_referenced() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.id = OLD.id THEN
        RETURN NEW;
    END IF;
    -- Wait for every transaction writing periods or jobs and keep new ones out until this one
    -- ends: what the checks read is then what the tables hold.
    LOCK TABLE periods, outbox IN SHARE MODE;
    IF EXISTS (SELECT 1 FROM periods WHERE version_id = OLD.id)
       OR EXISTS (SELECT 1 FROM outbox WHERE version_id = OLD.id) THEN
        RAISE EXCEPTION USING ERRCODE = 'foreign_key_violation',
            MESSAGE = 'schedule version ' || OLD.id || ' is named by periods or jobs';
    END IF;
    RETURN CASE WHEN TG_OP = 'UPDATE' THEN NEW ELSE OLD END;
END;
$$;
CREATE TRIGGER schedule_versions_keep_referenced BEFORE DELETE OR UPDATE OF id
    ON schedule_versions FOR EACH ROW EXECUTE FUNCTION schedule_versions_keep_referenced();
