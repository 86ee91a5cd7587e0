"""Conformal intervals, the adaptive correction carried across ticks, and the peak."""

from __future__ import annotations

import numpy as np
import pytest
from builders import NOW
from test_interval_resolve import reference as one_by_one

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast import forecast_series
from gpuscaler.core.forecast.intervals import (
    ACI_GAMMA,
    conformal_half_width,
    issue,
    peak_offset,
    resolve,
)
from gpuscaler.core.model import FitState, IntervalState, IssuedInterval, Series


@pytest.mark.parametrize(
    ("errors", "level", "expected"),
    [
        (list(range(1, 11)), 0.7, 8.0),  # rank ceil(11 * 0.7) = 8
        (list(range(1, 11)), 0.9, 10.0),  # rank ceil(11 * 0.9) = 10
        (list(range(1, 11)), 0.95, 10.0),  # rank 11 > 10: the largest
        (list(range(1, 20)), 0.5, 10.0),  # rank ceil(20 * 0.5) = 10
        ([*range(1, 11), np.nan, np.nan], 0.7, 8.0),  # gaps do not count
        (list(range(1, 8)), 0.7, np.nan),  # fewer than 8 errors: no interval
    ],
)
def test_the_conformal_half_width_uses_the_small_sample_rank(
    errors: list[float], level: float, expected: float
) -> None:
    resid = np.asarray(errors, dtype=float)[None, :, None]
    out = conformal_half_width(resid, np.array([level]))
    np.testing.assert_allclose(out[0, 0], expected, equal_nan=True)


def _state(level: float, lower: float, upper: float, steps: int = 3) -> IntervalState:
    start = IntervalState(level=level, checked_at=NOW)
    return issue(start, np.full(steps, lower), np.full(steps, upper), 10.0)


@pytest.mark.parametrize(
    ("observed", "moves"),
    [
        ([5.0, 5.0], +1),  # both inside [0, 10]: miss rate 0 < 0.3, the level drops
        ([50.0, 50.0], -1),  # both outside: miss rate 1 > 0.3, the level rises
    ],
)
def test_the_adaptive_level_moves_against_the_miss_rate(observed: list[float], moves: int) -> None:
    state = _state(0.7, 0.0, 10.0)
    row = np.array([1.0, 1.0, *observed])  # buckets ending NOW - 10 ... NOW + 20
    out = resolve(state, row, NOW + 20, 10.0, 0.7)
    miss = 0.0 if moves > 0 else 1.0
    assert out.level == pytest.approx(0.7 + ACI_GAMMA * (miss - 0.3))
    assert out.points == 2 and out.checked_at == NOW + 20
    assert len(out.pending) == 1  # its third step is not observed yet
    done = resolve(out, np.array([*row, 5.0]), NOW + 30, 10.0, 0.7)
    assert done.points == 3 and done.pending == ()  # each point is checked once


def test_a_gap_is_not_counted_as_a_miss() -> None:
    out = resolve(_state(0.7, 0.0, 10.0), np.array([50.0, np.nan]), NOW + 10, 10.0, 0.7)
    assert out.points == 0 and out.level == 0.7


def test_the_peak_offset_is_the_median_recent_peak_error() -> None:
    errors = np.array([[1.0, 2.0, 3.0, np.nan], [np.nan] * 4])
    np.testing.assert_allclose(peak_offset(errors), [2.0, 0.0])


def _series(values: np.ndarray, end: float) -> Series:
    return Series(start=end - 10.0 * (len(values) - 1), step=10.0, values=values)


def test_the_adaptive_state_rides_on_the_fit_state_from_tick_to_tick() -> None:
    """Noise that grows: intervals calibrated on the quiet past miss, so over the ticks
    the adaptive level rises above the nominal one and the reason says so."""
    rng = np.random.default_rng(3)
    values = 50 + rng.normal(0, 1, 900) * np.linspace(0.5, 4.0, 900)
    cfg = ForecastConfig()
    fits: dict[str, FitState] = {}
    levels = []
    for k in range(360, 900, 3):
        kept: dict[str, FitState] = {}
        now = NOW + 10.0 * k
        (sig,) = forecast_series(
            [_series(values[k - 360 : k], now)], cfg, now, keys=["p"], prior=fits, states=kept
        )
        fits = kept
        interval = fits["p"].interval
        assert interval is not None
        levels.append(interval.level)
    state = fits["p"].interval
    assert state is not None and state.points > 1000
    assert np.mean(levels[len(levels) // 2 :]) > 0.7  # wider than nominal while noise grows
    assert sig.forecast is not None and "interval at conformal level" in sig.forecast.reason
    assert abs(1 - state.misses / state.points - 0.7) < 0.05


def test_the_peak_is_above_a_flat_paths_maximum_when_peaks_ran_higher() -> None:
    rng = np.random.default_rng(4)
    noisy = 50 + rng.normal(0, 5, 360)  # i.i.d. noise: the path is flat, maxima are not
    (sig,) = forecast_series([_series(noisy, NOW)], ForecastConfig(), NOW)
    f = sig.forecast
    assert f is not None
    assert f.peak > f.mean.max() + 3.0
    assert f.peak < noisy.max() + 5.0


@pytest.mark.parametrize("seed", range(12))
def test_the_pending_intervals_checked_at_once_count_what_one_by_one_counted(seed: int) -> None:
    """Intervals of several lengths and origins (some fully observed, some not yet, some
    older than the window), rows with gaps: the same points, misses, level and pending."""
    rng = np.random.default_rng(seed)
    step, now = 10.0, NOW
    row = rng.normal(50, 10, 60)
    row[:50][rng.random(50) < 0.1] = np.nan  # the newest buckets are all observed
    checked_at = now - step * int(rng.integers(1, 4))
    pending = []
    for i in range(int(rng.integers(1, 12))):
        size = int(rng.integers(2 if i == 0 else 1, 31))
        # The first issued a bucket before the last check: some of it is new.
        origin = checked_at - step * (1 if i == 0 else int(rng.integers(0, 80)))
        centre = rng.normal(50, 10, size)
        width = rng.uniform(1, 20, size)
        pending.append(
            IssuedInterval(
                origin, step, tuple((centre - width).tolist()), tuple((centre + width).tolist())
            )
        )
    state = IntervalState(0.9, checked_at, tuple(pending), 40, 5)
    want = one_by_one(state, row, now, step, 0.9)
    got = resolve(state, row, now, step, 0.9)
    assert (got.points, got.misses, got.pending) == (want.points, want.misses, want.pending)
    assert want.points > 40  # each case checks observed points
    assert got.level == pytest.approx(want.level)
