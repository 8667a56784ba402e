-- oldest release: 0.1.0
-- cronkeeper schema, version 2: workers find due jobs of serial schedules without scanning every
-- available job (cronkeeper/db/outbox.py: outbox_serial_candidates).
CREATE INDEX outbox_available_serial ON outbox (schedule, run_after) WHERE state = 'available' AND serial;
