"""Runtime specs (cronkeeper.schedule.runtime), pure: the very specs and messages of
`check_schedule`; the grammar of files (H, L, #) is the runtime specs' too."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from cronkeeper.errors import ScheduleError
from cronkeeper.schedule.runtime import check_specs
from cronkeeper.schedule.validate import check_schedule

NOW = datetime(2026, 6, 1, tzinfo=UTC)
BASE = {"cron": "H 6 * * *", "timezone": "Europe/Berlin", "misfire": "latest",
        "task": "reports.daily", "owner": "team"}


def whole(name: str, table: dict):
    spec, diags = check_schedule(name, dict(table), file="<runtime>", line_of=lambda *p: 0,
                                 now=NOW, warnings_needed=False)
    return spec, [d.message for d in diags]


def test_a_generated_mapping_makes_the_specs_check_schedule_makes():
    tables = {f"t-{i}": {**BASE, "payload": {"tenant": i, "tags": ["a", i]},
                         "task": f"reports.t{i % 3}", "owner": f"o{i % 2}",
                         **({"description": f"tenant {i}"} if i % 2 else {})}
              for i in range(50)}
    checked = check_specs(tables, now=NOW)
    assert [c.spec.name for c in checked] == list(tables)
    for c in checked:
        spec, problems = whole(c.spec.name, tables[c.spec.name])
        assert problems == []
        assert c.spec == spec
        assert c.digest == spec.digest


@pytest.mark.parametrize("bad", [
    {"payload": {"x": float("nan")}}, {"payload": "x"}, {"task": "os:sys tem"}, {"owner": ""},
    {"owner": 3}, {"description": 1},
])
def test_a_bad_per_schedule_value_after_a_good_one_gets_validates_message(bad):
    tables = {"good": {**BASE, "payload": {"a": 1}}, "bad": {**BASE, "payload": {"a": 2}, **bad}}
    with pytest.raises(ScheduleError) as err:
        check_specs(tables, now=NOW)
    assert [p["message"] for p in err.value.problems] == whole("bad", tables["bad"])[1]
    assert {p["schedule"] for p in err.value.problems} == {"bad"}


def test_runtime_specs_take_the_files_grammar():
    """H, L and # (SPEC §19) come through the shared validation."""
    checked = check_specs({
        "spread": {**BASE, "cron": "H H(0-5) * * *"},
        "last-day": {**BASE, "cron": "0 9 L * *"},
        "last-friday": {**BASE, "cron": "0 9 * * 5L"},
        "second-monday": {**BASE, "cron": "0 9 * * mon#2"},
    }, now=NOW)
    fires = {c.spec.name: c.spec.trigger().next_fire(NOW) for c in checked}
    assert fires["last-day"].day == 30  # June's last day (09:00 Berlin is 07:00 UTC)
    assert fires["last-friday"].day == 26
    assert fires["second-monday"].day == 8
    assert fires["spread"].astimezone(ZoneInfo("Europe/Berlin")).hour in range(0, 6)
    with pytest.raises(ScheduleError) as err:
        check_specs({"bad": {**BASE, "cron": "0 9 W * *"}}, now=NOW)
    assert err.value.problems[0]["message"] == whole("bad", {**BASE, "cron": "0 9 W * *"})[1][0]
