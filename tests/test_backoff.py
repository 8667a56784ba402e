"""Retry delays (full jitter) and per-period jitter: pure, tested as tables."""

import pytest

from cronkeeper.backoff import backoff_ceiling, period_jitter, retry_delay


@pytest.mark.parametrize(
    ("attempt", "base", "factor", "maximum", "ceiling"),
    [(1, 30, 2, 3600, 30), (2, 30, 2, 3600, 60), (5, 30, 2, 3600, 480), (8, 30, 2, 3600, 3600),
     (10_000, 30, 2, 3600, 3600), (0, 30, 2, 3600, 30), (3, 0.1, 3, 10, 0.9)],
)
def test_ceiling_grows_exponentially_up_to_max(attempt, base, factor, maximum, ceiling):
    assert backoff_ceiling(attempt, base, factor, maximum) == pytest.approx(ceiling)


@pytest.mark.parametrize("rand", [0.0, 0.25, 0.5, 0.999])
def test_full_jitter_scales_the_whole_ceiling(rand):
    assert retry_delay(3, 30, 2, 3600, rand) == pytest.approx(120 * rand)


def test_rand_is_clamped():
    assert retry_delay(1, 30, 2, 3600, 7.0) == 30
    assert retry_delay(1, 30, 2, 3600, -1.0) == 0


def test_period_jitter_is_deterministic_and_bounded():
    keys = [f"nightly@2026-03-{d:02d}T07:00:00Z" for d in range(1, 29)]
    values = [period_jitter(k, 60) for k in keys]
    assert values == [period_jitter(k, 60) for k in keys]
    assert all(0 <= v < 60 for v in values)
    assert len(set(values)) == len(values)
    assert period_jitter("x", 0) == 0
