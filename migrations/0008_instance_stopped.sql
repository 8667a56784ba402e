-- oldest release: 0.1.0
-- cronkeeper schema, version 8: an instance that stops gracefully says so (role 'stopped'), so
-- status and the web show it as stopped, with its last real heartbeat, rather than as a stale
-- leader whose heartbeat was backdated by a day. A widened check only: 0.1.0 works with it
-- (docs/upgrading.md).
ALTER TABLE instances DROP CONSTRAINT instances_role_check;
ALTER TABLE instances ADD CONSTRAINT instances_role_check
    CHECK (role IN ('leader', 'standby', 'worker', 'relay', 'stopped'));
