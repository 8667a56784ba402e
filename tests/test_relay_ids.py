"""Target ids are pure functions of the idempotency key (SPEC §11): the same key always gives
the same id, the encodings obey each target's alphabet, and the RQ/BullMQ ones are reversible."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from cronkeeper.relay.targets.base import (
    bullmq_job_id,
    celery_task_id,
    rq_job_id,
    safe_id,
    sidekiq_jid,
    unsafe_id,
)

KEY = "nightly-invoices@2026-03-08T07:00:00Z"


def test_documented_examples():
    assert celery_task_id(KEY) == KEY
    assert rq_job_id(KEY) == "nightly-invoices_402026-03-08T07_3a00_3a00Z"
    assert bullmq_job_id(KEY) == "ck-nightly-invoices_402026-03-08T07_3a00_3a00Z"
    assert sidekiq_jid(KEY) == sidekiq_jid(KEY)
    assert re.fullmatch(r"[0-9a-f]{24}", sidekiq_jid(KEY))
    assert sidekiq_jid(KEY) != sidekiq_jid(KEY.replace("07:00", "07:01"))


def test_underscore_is_escaped_so_decoding_is_unambiguous():
    assert safe_id("a_b") == "a_5fb"
    assert unsafe_id(safe_id("a_5fb")) == "a_5fb"
    assert safe_id("a_5fb") != safe_id("a_b")


def test_integer_like_keys_never_give_an_integer_like_bullmq_id():
    for key in ("1", "42", "0", "-7", "12345678901234567890"):
        job_id = bullmq_job_id(key)
        assert not re.fullmatch(r"-?\d+", job_id)
        assert ":" not in job_id


@given(st.text(min_size=1, max_size=200))
def test_encodings_round_trip_and_obey_alphabets(key):
    encoded = rq_job_id(key)
    assert re.fullmatch(r"[A-Za-z0-9_-]+", encoded)
    assert unsafe_id(encoded) == key
    assert ":" not in bullmq_job_id(key)
    assert unsafe_id(bullmq_job_id(key)[3:]) == key
    assert re.fullmatch(r"[0-9a-f]{24}", sidekiq_jid(key))


@given(st.text(min_size=1, max_size=60), st.text(min_size=1, max_size=60))
def test_distinct_keys_give_distinct_ids(a, b):
    if a != b:
        assert rq_job_id(a) != rq_job_id(b)
        assert bullmq_job_id(a) != bullmq_job_id(b)
