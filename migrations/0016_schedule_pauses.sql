-- oldest release: 0.1.0
-- cronkeeper schema, version 16: pause judged per period at its due instant (SPEC §4: "a period
-- is decided when it is due, not before: pause and overlap are judged at that moment";
-- docs/guarantees.md, "Pause is judged at each period's due instant"). Additive: one table and a
-- function, which code older than this release never reads or writes; schedule_controls stays
-- as it is, written by every release's pause and resume, and read by 0.1.0 and by `status`.
--
-- schedule_pauses: each span a schedule was paused, [paused_at, resumed_at), the instants the
-- pause's and the resume's transactions took (clock_timestamp(), after the schedule's controls
-- row was locked; the same instant is that row's changed_at). A period p is paused iff a span
-- has paused_at <= p < coalesce(resumed_at, infinity), however late the leader decides it (a
-- tick after the resume, a catch-up after an outage). resumed_at NULL: not resumed yet.
-- paused_at '-infinity': a pause an older release wrote (schedule_controls.paused, no span),
-- resumed by this one: paused since ever, as that release judged it.
-- Rows older releases leave behind are read by the leader as follows: controls paused with no
-- open span is paused since ever; controls not paused with a span still open (resumed by an
-- older release) is that span ended at schedule_controls.changed_at.
CREATE TABLE schedule_pauses (
    schedule    text NOT NULL,
    paused_at   timestamptz NOT NULL,
    resumed_at  timestamptz,
    PRIMARY KEY (schedule, paused_at),
    CHECK (resumed_at IS NULL OR resumed_at >= paused_at)
);
-- At most one open span per schedule; the leader reads the open ones each tick through it.
CREATE UNIQUE INDEX schedule_pauses_open ON schedule_pauses (schedule) WHERE resumed_at IS NULL;
-- The leader reads the spans resumed after the oldest period it decides; retention prunes by it.
CREATE INDEX schedule_pauses_resumed ON schedule_pauses (resumed_at) WHERE resumed_at IS NOT NULL;

-- Retention, with the periods' (prune()): SECURITY DEFINER so the scheduler's role needs EXECUTE
-- on it, not DELETE. Removes, at most batch_size at a time, spans resumed before `before`: no
-- period they cover is still undecided or kept.
CREATE FUNCTION schedule_pauses_prune(before timestamptz, batch_size integer)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    pruned bigint;
BEGIN
    DELETE FROM schedule_pauses WHERE (schedule, paused_at) IN (
        SELECT schedule, paused_at FROM schedule_pauses
        WHERE resumed_at < before
        ORDER BY resumed_at LIMIT batch_size);
    GET DIAGNOSTICS pruned = ROW_COUNT;
    RETURN pruned;
END;
$$;
