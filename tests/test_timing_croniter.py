"""A differential run against croniter 2.0.7 (the test extra pins it; it knows ``L`` and ``#``)
for the forms both accept, every difference explained (docs/schedules.md, "croniter").

Expressions are drawn (seeded) from fields both grammars read: numbers, lists, ranges, steps,
names, day-of-month ``L``, day-of-week ``N#K`` and ``NL`` (croniter writes the last Friday
``L5``, cronkeeper ``5L``). croniter's ``H`` hashes differently (its own function of a
``hash_id``), so ``H`` is not compared; cronkeeper's is pinned by tests/test_timing_hashed.py
and checked by tests/test_timing_reference.py. Both run over 2026-2030 in UTC: croniter's
handling of DST is not cronie's (in America/New_York it puts fires at wall times the expression
does not name for weeks after a change, and can return an earlier instant than the last), so
DST is judged by the brute-force reference instead.

Each instant fired by one side only must be explained by a row of :data:`EXPECTED`, and each
row must explain something (a row that no longer applies is stale and fails too).
"""

from __future__ import annotations

import calendar
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from croniter import CroniterBadDateError, croniter

from cronkeeper.timing import make_trigger, parse_cron

FROM = datetime(2026, 1, 1, tzinfo=UTC)
UNTIL = datetime(2031, 1, 1, tzinfo=UTC)  # exclusive
MINUTE = ["0", "30", "15,45", "5-10/5", "*/20", "59"]
HOUR = ["0", "3", "12", "9-17/4", "*/6", "23", "1,2"]
DOM = ["*", "*", "*", "1", "15", "L", "L,15", "1,L", "1-7", "*/10", "28-31", "29", "30", "31"]
MONTH = ["*", "*", "2", "1-6", "feb,nov", "3,10,11", "*/3", "jan-mar"]
DOW = ["*", "*", "*", "0", "1-5", "sat,sun", "mon#2", "1#1,3#3", "5#5", "L5", "L0,L3", "7#1",
       "fri#4", "L1", "SUN#2", "L6"]  # fmt: skip


def ours(dow: str) -> str:
    """croniter's last weekday ``L5`` as cronkeeper writes it, ``5L``."""
    return re.sub(r"L(\d)", r"\1L", dow)


def listed_days(dom: str, day: date) -> bool:
    """Whether ``day`` matches a day-of-month field of numbers, ranges, steps and ``L``."""
    last = calendar.monthrange(day.year, day.month)[1]
    for item in dom.split(","):
        body, _, step = item.partition("/")
        if body == "L":
            if day.day == last:
                return True
            continue
        first, _, end = ("1-31" if body == "*" else body).partition("-")
        days = range(int(first), int(end or first) + 1, int(step or 1))
        if day.day in days:
            return True
    return False


def day_numbers(dom: str) -> set[int]:
    return {d for d in range(1, 32) if listed_days(dom, date(2026, 1, d))}


@dataclass(frozen=True)
class Expected:
    side: str  # who fires the instant: "cronkeeper" or "croniter"
    reason: str
    applies: Callable[[str, str, datetime], bool]  # (day-of-month, day-of-week, instant)


EXPECTED = {
    "star-step day field": Expected(
        "croniter",
        "A day field written '*/n' counts as '*' (cronie's DOM_STAR / DOW_STAR, SPEC §4): with "
        "the other day field restricted, a day must match both. croniter looks at the values the "
        "field expands to, sees a restriction, and fires on days matching either.",
        lambda dom, dow, t: (dom.startswith("*/") and dow != "*")
        or (dow.startswith("*/") and dom != "*"),
    ),
    "either day, with N#K or NL": Expected(
        "cronkeeper",
        "Both day fields restricted and day-of-week holding N#K or NL: a day matching either "
        "fires (SPEC §4, POSIX). croniter 2.0.7 fires only the day-of-week's days, dropping "
        "the day-of-month ones (or gives up: CroniterBadDateError, 'failed to find next date').",
        lambda dom, dow, t: not dom.startswith("*") and ("#" in dow or "L" in dow)
        and listed_days(dom, t.date()),
    ),
    "March after February": Expected(
        "cronkeeper",
        "croniter 2.0.7 skips the first listed days of March after a fire in February when "
        "day-of-month lists a day February lacks (29-31): from 21 February with '*/10' (1, 11, "
        "21, 31) its next fire is 11 March, not 1 March.",
        lambda dom, dow, t: t.month == 3 and max(day_numbers(dom)) > 28,
    ),
}


def croniter_fires(expr: str) -> list[datetime] | None:
    """croniter's fires in [FROM, UNTIL), or None when it gives up (CroniterBadDateError)."""
    it = croniter(expr, FROM - timedelta(seconds=1))
    out: list[datetime] = []
    try:
        while (t := it.get_next(datetime)) < UNTIL:
            assert not out or t > out[-1], (expr, t)  # never the case in UTC
            out.append(t.astimezone(UTC))
    except CroniterBadDateError:
        return None
    return out


# Beside the drawn ones: one of each difference found while writing this test.
CHOSEN = ["5-10/5 12 */10 1-6 *", "0 12 L * L5", "0 12 1,15 * mon#2", "0 0 */2 * 1",
          "0 0 1-5 * L5", "30 2 */10 * 1-5"]  # fmt: skip


def expressions(count: int, seed: int = 25) -> list[tuple[str, ...]]:
    rng = random.Random(seed)
    seen: dict[str, tuple[str, ...]] = {e: tuple(e.split()) for e in CHOSEN}
    while len(seen) < count + len(CHOSEN):
        fields = tuple(rng.choice(choices) for choices in (MINUTE, HOUR, DOM, MONTH, DOW))
        seen.setdefault(" ".join(fields), fields)
    return list(seen.values())


def test_cronkeeper_and_croniter_agree_but_for_the_explained_differences() -> None:
    counts: Counter[str] = Counter()
    compared = instants = gave_up = never = differing = 0
    for minute, hour, dom, month, dow in expressions(160):
        theirs = croniter_fires(f"{minute} {hour} {dom} {month} {dow}")
        expr = f"{minute} {hour} {dom} {month} {ours(dow)}"
        if parse_cron(expr).never_fires():  # validate refuses it; croniter finds no date
            assert theirs is None, expr
            never += 1
            continue
        trigger = make_trigger(cron=expr, every=None, timezone="UTC")
        mine = list(trigger.fires(FROM - timedelta(seconds=1), UNTIL - timedelta(seconds=1)))
        compared += 1
        instants += len(mine)
        if theirs is None:
            gave_up += 1
            assert not dom.startswith("*") and ("#" in dow or "L" in dow), expr
            counts["either day, with N#K or NL (croniter gave up)"] += len(mine)
            continue
        differing += set(mine) != set(theirs)
        for side, only in (("cronkeeper", set(mine) - set(theirs)),
                           ("croniter", set(theirs) - set(mine))):  # fmt: skip
            for t in sorted(only):
                reason = next((name for name, row in EXPECTED.items()
                               if row.side == side and row.applies(dom, ours(dow), t)), None)  # fmt: skip
                assert reason is not None, f"{expr!r}: {t.isoformat()} fired by {side} only"
                counts[reason] += 1
    print(f"\ncroniter differential: {compared} expressions ({never} more that never fire), "
          f"{instants} cronkeeper instants, {gave_up} croniter gave up on, {differing} more "
          f"differ; differing instants by reason: {dict(counts)}")
    assert compared + never == 160 + len(CHOSEN) and compared > 140 and instants > 50_000
    assert set(EXPECTED) <= set(counts), "a row of EXPECTED explains nothing: remove it"
    assert gave_up > 0


def test_the_forms_agree_where_no_difference_applies() -> None:
    """The new forms alone, where croniter is right: identical to the instant."""
    for expr in ("0 0 L * *", "30 12 L,15 feb,nov *", "0 9 * * mon#2", "0 9 * * L5",
                 "0 9 * * 1#1,3#3", "0 0 * * 5#5", "15 6 * 1-6 L0,L3", "0 0 * * 7#1"):  # fmt: skip
        trigger = make_trigger(cron=ours(expr), every=None, timezone="UTC")
        mine = list(trigger.fires(FROM - timedelta(seconds=1), UNTIL - timedelta(seconds=1)))
        assert mine == croniter_fires(expr) and mine, expr
