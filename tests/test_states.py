"""The stored states' enums are spelled exactly as the schema's CHECK constraints allow, and the
relay fails a publish by the worker's own policy (cronkeeper.endings)."""

from __future__ import annotations

import re

import pytest

from cronkeeper.backoff import DEFAULT_BASE, DEFAULT_FACTOR, DEFAULT_MAX, backoff_ceiling
from cronkeeper.db.enqueue import DEFAULT_BACKOFF
from cronkeeper.endings import Ending, Kind, next_state
from cronkeeper.schedule.model import ScheduleSpec
from cronkeeper.states import AttemptOutcome, JobState, PeriodOutcome


def allowed(engine, table: str, column: str) -> set[str]:
    """The values the column's CHECK constraint lists, read from the migrated schema."""
    with engine.connect() as conn:
        defs = conn.exec_driver_sql(
            "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c "
            "JOIN pg_class t ON t.oid = c.conrelid "
            "WHERE c.contype = 'c' AND t.relname = %(t)s "
            "AND t.relnamespace = to_regnamespace(current_schema())",
            {"t": table}).scalars().all()
    found = [d for d in defs if re.search(rf"\({column} = ANY \(ARRAY\[", d)]
    assert len(found) == 1, (table, column, defs)
    return set(re.findall(r"'([a-z_]+)'::text", found[0]))


@pytest.mark.parametrize(("enum", "table", "column"), [
    (JobState, "outbox", "state"),
    (AttemptOutcome, "attempts", "outcome"),
    (PeriodOutcome, "periods", "outcome"),
])
def test_each_enum_is_its_columns_check(engine, enum, table, column):
    assert {m.value for m in enum} == allowed(engine, table, column)


def test_the_backoff_defaults_are_one_set_everywhere():
    spec = ScheduleSpec(name="s", every=60, timezone="UTC", misfire="skip", task="t")
    assert (spec.backoff.base, spec.backoff.factor, spec.backoff.max) == (
        DEFAULT_BASE, DEFAULT_FACTOR, DEFAULT_MAX)
    assert DEFAULT_BACKOFF == {"base": 30, "factor": 2, "max": 3600}  # as enqueue stores it


def test_the_policy_caps_attempts_and_backs_off_with_full_jitter():
    failed = Ending(Kind.RETRYABLE, "boom")
    retry = next_state(failed, 2, 5, {}, 0.5)
    assert (retry.state, retry.outcome) == (JobState.AVAILABLE, AttemptOutcome.RETRY)
    assert retry.delay == 0.5 * backoff_ceiling(2, DEFAULT_BASE, DEFAULT_FACTOR, DEFAULT_MAX)
    assert next_state(failed, 2, 5, {"base": 1, "factor": 3, "max": 2}, 0.999).delay < 2
    last = next_state(failed, 5, 5, {}, 0.5)
    assert (last.state, last.outcome, last.delay) == (JobState.DEAD, AttemptOutcome.DEAD, 0.0)
    assert last.error == "boom (attempt 5 of 5: giving up)"
    timeout = next_state(Ending(Kind.TIMEOUT, "t"), 5, 5, {}, 0.5)
    assert (timeout.state, timeout.outcome) == (JobState.DEAD, AttemptOutcome.TIMEOUT)
    permanent = next_state(Ending(Kind.PERMANENT, "bad"), 1, 5, {}, 0.5)
    assert (permanent.state, permanent.outcome) == (JobState.DEAD, AttemptOutcome.DEAD)


def test_the_serial_claims_lock_key_is_the_one_docs_outbox_md_derives():
    import hashlib  # noqa: PLC0415

    from cronkeeper.db.engine import serial_lock_key  # noqa: PLC0415

    digest = hashlib.sha256(b"cronkeeper-serial:cronkeeper:nightly-invoices").digest()
    assert serial_lock_key("cronkeeper", "nightly-invoices") == int.from_bytes(
        digest[:8], "big", signed=True)
