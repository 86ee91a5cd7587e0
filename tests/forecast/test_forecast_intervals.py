"""Conformal intervals, the adaptive correction carried across ticks, and the peak."""

from __future__ import annotations

import numpy as np
import pytest
from builders import NOW

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast import EMPTY, forecast
from gpuscaler.core.forecast.intervals import (
    ACI_GAMMA,
    Adaptive,
    check,
    conformal_half_width,
    fresh,
    issue,
    peak_offset,
)
from gpuscaler.core.model import Series


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
    resid = np.asarray(errors, dtype=float)[None, None, :]
    out = conformal_half_width(resid, np.array([level]))
    np.testing.assert_allclose(out[0, 0], expected, equal_nan=True)


def _state(level: float, lower: float, upper: float, steps: int = 3) -> Adaptive:
    start = check(fresh(1, steps + 1, steps, level), np.ones((1, 1)), NOW, 10.0, level)
    return issue(start, NOW, np.full((1, steps), lower), np.full((1, steps), upper))


@pytest.mark.parametrize(
    ("observed", "moves"),
    [
        ([5.0, 5.0], +1),  # both inside [0, 10]: miss rate 0 < 0.3, the level drops
        ([50.0, 50.0], -1),  # both outside: miss rate 1 > 0.3, the level rises
    ],
)
def test_the_adaptive_level_moves_against_the_miss_rate(observed: list[float], moves: int) -> None:
    state = _state(0.7, 0.0, 10.0)
    row = np.array([[1.0, 1.0, *observed]])  # buckets ending NOW - 10 ... NOW + 20
    out = check(state, row, NOW + 20, 10.0, 0.7)
    miss = 0.0 if moves > 0 else 1.0
    assert out.level[0] == pytest.approx(0.7 + ACI_GAMMA * (miss - 0.3))
    assert out.points[0] == 2 and out.checked_at[0] == NOW + 20
    assert np.isfinite(out.issued_at).sum() == 1  # its third step is not observed yet
    done = check(out, np.array([[*row[0], 5.0]]), NOW + 30, 10.0, 0.7)
    assert done.points[0] == 3 and not np.isfinite(done.issued_at).any()  # each point once


def test_a_gap_is_not_counted_as_a_miss() -> None:
    out = check(_state(0.7, 0.0, 10.0), np.array([[50.0, np.nan]]), NOW + 10, 10.0, 0.7)
    assert out.points[0] == 0 and out.level[0] == 0.7


def test_a_full_ring_replaces_its_oldest_interval() -> None:
    state = _state(0.7, 0.0, 10.0, steps=1)  # two slots
    state = issue(state, NOW + 1, np.ones((1, 1)), np.ones((1, 1)))
    state = issue(state, NOW + 2, np.ones((1, 1)), np.ones((1, 1)))
    assert sorted(state.issued_at[0].tolist()) == [NOW + 1, NOW + 2]


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
    fits = EMPTY
    levels = []
    for k in range(360, 900, 3):
        now = NOW + 10.0 * k
        (sig,), fits = forecast([_series(values[k - 360 : k], now)], cfg, now, fits, keys=["p"])
        (rows,) = fits.batches
        levels.append(float(rows.adaptive.level[0]))
    state = fits.batches[0].adaptive
    assert state.points[0] > 1000
    assert np.mean(levels[len(levels) // 2 :]) > 0.7  # wider than nominal while noise grows
    assert sig.forecast is not None and "interval at conformal level" in sig.forecast.reason
    assert abs(1 - state.misses[0] / state.points[0] - 0.7) < 0.05


def test_the_peak_is_above_a_flat_paths_maximum_when_peaks_ran_higher() -> None:
    rng = np.random.default_rng(4)
    noisy = 50 + rng.normal(0, 5, 360)  # i.i.d. noise: the path is flat, maxima are not
    (sig,), _ = forecast([_series(noisy, NOW)], ForecastConfig(), NOW)
    f = sig.forecast
    assert f is not None
    assert f.peak > f.mean.max() + 3.0
    assert f.peak < noisy.max() + 5.0
