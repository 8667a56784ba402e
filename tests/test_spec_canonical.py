"""ScheduleSpec.canonical_text, written field by field, is canonical_json(to_json()) exactly:
stored versions are compared by the digest of this text, so one byte of difference would make
every schedule a new version at the next start."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from cronkeeper.schedule.model import (
    Backoff,
    Misfire,
    OnCalendar,
    Overlap,
    ScheduleSpec,
    canonical_json,
)
from cronkeeper.timing.calendars import Calendar

text = st.text(max_size=20)  # any code point: quotes, backslashes, controls, non-ASCII
seconds = st.one_of(st.floats(min_value=0, max_value=1e9, allow_nan=False), st.integers(0, 10**9))
payload = st.dictionaries(
    text, st.one_of(st.integers(), st.booleans(), text, st.floats(allow_nan=False,
                    allow_infinity=False), st.lists(st.integers(), max_size=3)), max_size=4
).map(json.dumps)  # not canonical: key order, spaces  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    name=text, timezone=text, misfire=st.sampled_from(list(Misfire)),
    cron=st.none() | text, every=st.none() | seconds, catch_up_limit=seconds,
    overlap=st.sampled_from(list(Overlap)), task=st.none() | text,
    command=st.none() | st.lists(text, max_size=3).map(tuple), payload_json=payload,
    grace=seconds, jitter=seconds, timeout=seconds, max_attempts=st.integers(1, 1000),
    backoff=st.builds(Backoff, seconds, seconds, seconds),
    codes=st.lists(st.integers(1, 255), max_size=3).map(tuple),
    owner=st.none() | text, description=st.none() | text,
    output_limit=st.sampled_from([65536, 0, 1, 1 << 20]) | st.integers(0, 1 << 20),
    calendar=st.none() | st.builds(Calendar.of, text, st.lists(st.dates(), max_size=5)),
    on_calendar=st.sampled_from(list(OnCalendar)),
)  # fmt: skip
def test_canonical_text_is_canonical_json_of_to_json(
    name, timezone, misfire, cron, every, catch_up_limit, overlap, task, command, payload_json,
    grace, jitter, timeout, max_attempts, backoff, codes, owner, description, output_limit,
    calendar, on_calendar,
):  # fmt: skip
    spec = ScheduleSpec(
        name, timezone, misfire, cron, every, catch_up_limit, overlap, task, command,
        payload_json, grace, jitter, timeout, max_attempts, backoff, codes, owner, description,
        output_limit, calendar, on_calendar,
    )  # fmt: skip
    assert spec.canonical_text() == canonical_json(spec.to_json())


def test_renamed_changes_name_task_description_and_place_only():
    spec = ScheduleSpec("a", "UTC", Misfire.SKIP, cron="* * * * *", task="t", owner="o",
                        description="d", payload_json='{"x":1}', file="f", line=3)  # fmt: skip
    other = spec.renamed("b", "u", None, "g", 9)
    held = ScheduleSpec("a", "UTC", Misfire.SKIP, cron="* * * * *", task="t",
                        calendar=Calendar.of("h", []), on_calendar=OnCalendar.NEXT_DAY)
    assert held.renamed("b", "u", None, "g", 9).calendar is held.calendar
    assert held.renamed("b", "u", None, "g", 9).on_calendar is OnCalendar.NEXT_DAY
    assert (other.name, other.task, other.description, other.file, other.line) == (
        "b", "u", None, "g", 9)  # fmt: skip
    assert other == ScheduleSpec("b", "UTC", Misfire.SKIP, cron="* * * * *", task="u",
                                 owner="o", payload_json='{"x":1}')  # fmt: skip
