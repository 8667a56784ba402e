"""How many jobs a worker claims beyond its free threads (runtime.Ahead): a table of cases."""

import pytest

from cronkeeper.worker.runtime import Ahead


def ahead_after(durations: list[float], *, concurrency: int = 10, batch: int = 100,
                longest_running: float = 0.0) -> int:
    ahead = Ahead(concurrency, batch)
    for seconds in durations:
        ahead.observe(seconds)
    return ahead.extra(longest_running)


@pytest.mark.parametrize(("durations", "kwargs", "expected"), [
    ([], {}, 0),                                   # nothing observed yet: claim for free threads only
    ([0.0001] * 50, {}, 100),                      # no-op handlers: a whole batch ahead
    ([0.0001] * 50, {"batch": 20}, 20),            # never more than a batch
    ([0.01] * 50, {}, 100),                        # 10 ms x 10 threads: 100 start within 0.1 s
    ([0.05] * 50, {}, 20),                         # 50 ms: 20 start within 0.1 s
    ([0.05] * 50, {"concurrency": 2}, 4),
    ([0.1] * 50, {}, 0),                           # a tenth of a second or more: none ahead
    ([2.0] * 50, {}, 0),
    ([0.0001] * 50, {"longest_running": 1.5}, 0),  # a handler stuck for 1.5 s: hold nothing back
    ([0.0001] * 50, {"longest_running": 0.5}, 100),
])
def test_jobs_claimed_ahead(durations, kwargs, expected):
    assert ahead_after(durations, **kwargs) == expected


def test_a_slow_run_of_jobs_stops_the_claiming_ahead_quickly():
    ahead = Ahead(10, 100)
    for _ in range(200):
        ahead.observe(0.0005)
    assert ahead.extra(0.0) == 100
    seen = []
    for _ in range(5):  # handlers suddenly take 3 s each
        ahead.observe(3.0)
        seen.append(ahead.extra(0.0))
    assert seen[-1] == 0 and seen[0] == 0  # the first slow ending is enough
