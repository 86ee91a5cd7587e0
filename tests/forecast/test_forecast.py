"""Forecasting engines, bucketing and method choice."""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np
import pytest
from builders import NOW

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast import Arima, ForecastState, StatsmodelsArima, bucket, forecast
from gpuscaler.core.forecast.arima import half_width, last_finite
from gpuscaler.core.forecast.ensemble import MEMBERS, choose_method, normalized
from gpuscaler.core.forecast.members import bucket_rows
from gpuscaler.core.model import Series


class Paths(NamedTuple):
    mean: np.ndarray
    lower: np.ndarray
    upper: np.ndarray


def _paths(arima: Arima, hist: np.ndarray, steps: int, level: float) -> Paths:
    """The model's own path and interval, fitted on `hist`."""
    c = arima.fit(hist)
    mean, half = arima.predict(c, hist, steps), half_width(arima.spread(c, steps), level)
    return Paths(mean, mean - half, mean + half)


def arima_paths(
    n: int, t: int, phi: tuple[float, ...], seed: int, sigma: float = 1.0
) -> np.ndarray:
    """Simulate ARIMA(p,1,0) series: AR(p) differences, integrated, around level 50."""
    rng = np.random.default_rng(seed)
    p = len(phi)
    z = np.zeros((n, t + 100))
    e = rng.normal(0, sigma, (n, t + 100))
    for j in range(p, t + 100):
        z[:, j] = sum(phi[i] * z[:, j - 1 - i] for i in range(p)) + e[:, j]
    return 50 + np.cumsum(z[:, 100:], axis=1)


def test_the_fast_engine_recovers_ar_coefficients_of_every_series_in_a_batch() -> None:
    hist = arima_paths(40, 2000, (0.5, -0.3), seed=1)
    fitted = Arima(2, 1).fit(hist)
    assert np.allclose(fitted.phi.mean(axis=0), [0.5, -0.3], atol=0.03)
    assert np.all(np.abs(fitted.phi[:, 0] - 0.5) < 0.1)
    assert np.allclose(fitted.sigma2, 1.0, atol=0.15)


def test_the_fast_engine_matches_statsmodels_arima_on_the_same_order() -> None:
    hist = arima_paths(4, 360, (0.4, 0.2, -0.1, 0.05, 0.0), seed=2)
    fast = _paths(Arima(5, 1), hist, 30, 0.8)
    ref = Paths(*StatsmodelsArima((5, 1, 0)).forecast(hist, 30, 0.8))
    scale = np.abs(ref.upper - ref.mean).mean()
    assert np.abs(fast.mean - ref.mean).max() < 0.25 * scale
    width_ratio = (fast.upper - fast.mean) / (ref.upper - ref.mean)
    assert np.all((width_ratio > 0.85) & (width_ratio < 1.15))


def test_prediction_intervals_cover_about_their_level() -> None:
    hist = arima_paths(400, 600, (0.6,), seed=3)
    train, future = hist[:, :570], hist[:, 570:]
    paths = _paths(Arima(1, 1), train, 30, 0.8)
    inside = (future >= paths.lower) & (future <= paths.upper)
    assert 0.74 < inside.mean() < 0.86


def test_gaps_stay_gaps_and_still_give_a_finite_forecast() -> None:
    hist = arima_paths(2, 400, (0.5,), seed=4)
    hist[0, 100:140] = np.nan
    hist[1, -3:] = np.nan  # the newest samples missing
    paths = _paths(Arima(5, 1), hist, 10, 0.8)
    assert np.all(np.isfinite(paths.mean)) and np.all(np.isfinite(paths.upper))
    assert np.isnan(hist[0, 120])  # nothing filled in the input


def test_a_flat_series_forecasts_its_level_with_a_finite_interval() -> None:
    hist = np.full((1, 200), 42.0)
    paths = _paths(Arima(5, 1), hist, 10, 0.8)
    assert np.allclose(paths.mean, 42.0)
    assert np.all(np.isfinite(paths.upper))


def test_a_series_too_short_to_fit_gives_nan_not_a_guess() -> None:
    paths = _paths(Arima(5, 1), np.full((1, 6), 1.0), 5, 0.8)
    assert np.all(np.isnan(paths.mean))


def test_last_finite_skips_trailing_gaps_and_reports_all_nan_rows() -> None:
    a = np.array([[1.0, 2.0, np.nan], [np.nan, np.nan, np.nan], [3.0, np.nan, 4.0]])
    out = last_finite(a)
    assert out[0] == 2.0 and np.isnan(out[1]) and out[2] == 4.0


@pytest.mark.parametrize(
    ("values", "end_offset", "expected"),
    [
        ([1, 3, 5, 7], 0, [2.0, 6.0]),
        ([1, np.nan, np.nan, np.nan], 0, [1.0, np.nan]),
        ([1, 3, 5, 7, 9], 0, [4.0, 8.0]),  # the oldest partial bucket is dropped
        ([1, 3, 5, 7], 1, [4.0, 7.0]),  # the newest bucket ends at `end`, one step later
    ],
)
def test_bucket_averages_finite_samples_per_bucket(
    values: list[float], end_offset: int, expected: list[float]
) -> None:
    s = Series(start=0.0, step=0.5, values=np.asarray(values, dtype=float))
    out = bucket(s, 1.0, s.end + 0.5 * end_offset)
    np.testing.assert_allclose(out, expected, equal_nan=True)


def _series(values: np.ndarray, step: float = 0.5) -> Series:
    return Series(start=NOW - step * (len(values) - 1), step=step, values=values)


def test_on_a_spiky_series_the_ensemble_beats_arima_alone_and_reports_every_error() -> None:
    rng = np.random.default_rng(5)
    spiky = 40 + rng.exponential(10, 7200)  # i.i.d. spikes: no memory for the AR to use
    (sig,), _ = forecast([_series(spiky)], ForecastConfig(), NOW)
    assert sig.forecast is not None and sig.problem is None
    errors = sig.forecast.errors
    members = {"arima", "ses", "ses_avg", "window_mean", "window_mean_long", "last_value"}
    assert set(errors) == {"ensemble", *members}
    assert errors["ensemble"] < errors["arima"]
    assert errors["ensemble"] < errors["last_value"]
    assert "window mean" in sig.forecast.reason and "last value" in sig.forecast.reason


@pytest.mark.parametrize(
    ("errors", "chosen"),
    [
        ({"ensemble": 10.0, "last_value": 12.0}, "ensemble"),
        ({"ensemble": 10.0, "last_value": 8.0}, "ensemble"),  # 20 %: within the noise
        ({"ensemble": 10.0, "last_value": 7.5}, "ensemble"),  # exactly 25 % is not over
        ({"ensemble": 10.0, "last_value": 7.4}, "last_value"),
        ({"ensemble": 10.0, "last_value": 9.0, "window_mean": 1.0}, "ensemble"),  # a member
        ({"last_value": 9.0}, "last_value"),  # no ensemble error: nothing to weigh
    ],
)
def test_the_last_value_replaces_the_ensemble_only_with_a_clear_margin(
    errors: dict[str, float], chosen: str
) -> None:
    assert choose_method(errors) == chosen


@pytest.mark.parametrize(
    ("other", "arima_live", "expected"),
    [
        (1.0, True, 0.0),  # as good as ARIMA: no weight
        (0.8, True, 0.0),  # worse than ARIMA: no weight
        (1.01, True, 0.505 / 1.505),  # ARIMA's error 1 % above its: half its weight
        (1.02, True, 1.02 / 2.02),  # 2 % above: its full weight
        (4.0, True, 0.8),  # far better: its full weight
        (1.0, False, 1.0),  # ARIMA has no live path: the other carries the forecast
    ],
)
def test_other_members_take_weight_from_arima_only_when_clearly_more_accurate(
    other: float, arima_live: bool, expected: float
) -> None:
    raw = np.array([[1.0, other, 0.0, 0.0]])  # arima, ses, ses_avg, window_mean
    live = {m: np.ones((1, 3)) for m in MEMBERS}
    if not arima_live:
        live["arima"] = np.full((1, 3), np.nan)
    weights = normalized(raw, live)
    assert weights[0, MEMBERS.index("ses")] == pytest.approx(expected)
    assert weights.sum() == pytest.approx(1.0)


def test_a_dropped_arima_leaves_the_other_members_their_evidence_weights() -> None:
    raw = np.array([[0.0, 1.0, 3.0, 0.0]])  # arima, ses, ses_avg, window_mean
    weights = normalized(raw, {m: np.ones((1, 3)) for m in MEMBERS})
    assert weights[0, MEMBERS.index("ses")] == pytest.approx(0.25)
    assert weights[0, MEMBERS.index("ses_avg")] == pytest.approx(0.75)


def test_after_a_clean_level_shift_the_forecast_follows_the_new_level() -> None:
    level = np.full(7200, 30.0)
    level[-8 * 120 :] = 70.0  # a noiseless step 8 minutes ago: the smoothers still lag it
    (sig,), _ = forecast([_series(level)], ForecastConfig(), NOW)
    assert sig.forecast is not None
    assert np.all(np.abs(sig.forecast.mean - 70.0) < 2.5)
    assert "last value" in sig.forecast.reason


def test_a_unit_root_fit_on_a_clean_ramp_is_dropped_and_the_reason_says_so() -> None:
    ramp = 10 + np.arange(7200) * 0.01  # constant differences: AR sum of phi = 1
    (sig,), _ = forecast([_series(ramp)], ForecastConfig(), NOW)
    assert sig.forecast is not None and sig.problem is None
    assert "arima(5,1,0) dropped: unstable fit" in sig.forecast.reason
    assert "arima" not in sig.forecast.errors
    assert sig.forecast.mean.max() <= ramp.max() + (ramp.max() - ramp.min())


def test_forecast_keeps_the_model_on_a_trending_series() -> None:
    t = np.arange(7200)
    trend = 20 + 60 * t / 7200 + np.sin(t / 300) * 5
    (sig,), _ = forecast([_series(trend)], ForecastConfig(), NOW)
    assert sig.forecast is not None
    assert sig.forecast.method == "ensemble"
    assert sig.forecast.mean[-1] > trend[-1] - 1  # follows the trend, does not fall back


SHORT = np.concatenate([np.full(7000, np.nan), np.full(200, 50.0)])


@pytest.mark.parametrize(
    ("series", "problem"),
    [(None, "no samples"), (np.full(7200, np.nan), "no samples"), (SHORT, "only 100s of samples")],
)
def test_forecast_says_why_there_is_no_forecast(series: np.ndarray | None, problem: str) -> None:
    (sig,), _ = forecast([None if series is None else _series(series)], ForecastConfig(), NOW)
    assert sig.forecast is None
    assert sig.problem is not None and problem in sig.problem


def test_a_batch_of_mixed_grids_reports_each_series_last_sample_time() -> None:
    gappy = np.concatenate([50 + np.sin(np.arange(7000) / 300), np.full(10, np.nan)])
    batch = [
        None,
        Series(NOW, 10.0, np.empty(0)),
        _series(gappy),
        _series(SHORT),
        Series(NOW - 600, 60.0, np.full(11, 40.0)),
        _series(np.full(7200, np.nan)),
    ]
    signals, _ = forecast(batch, ForecastConfig(), NOW)
    expected = [None, None, NOW - 5.0, NOW, NOW, None]  # the last finite sample's time
    assert [s.last_sample_time for s in signals] == expected
    assert [s.forecast is not None for s in signals] == [False, False, True, False, False, False]


def test_utilization_forecasts_are_clipped_to_zero_to_one_hundred() -> None:
    t = np.arange(7200)
    rising = np.minimum(100, 10 + t * 0.02)
    (sig,), _ = forecast([_series(rising)], ForecastConfig(), NOW, clips=[(0.0, 100.0)])
    assert sig.forecast is not None
    assert sig.forecast.upper.max() <= 100.0 and sig.forecast.lower.min() >= 0.0


def test_a_fit_younger_than_refit_every_is_reused_and_an_older_one_refitted() -> None:
    cfg = ForecastConfig()
    base = 50 + np.sin(np.arange(7200) / 400) * 10
    _, first = forecast([_series(base)] * 2, cfg, NOW, keys=["a", "b"])
    (rows,) = first.batches
    prior = ForecastState((replace(rows, fitted_at=np.array([NOW - 100, NOW - 400])),))
    _, later = forecast([_series(base)] * 3, cfg, NOW + 30, prior, keys=["a", "b", "c"])
    fitted = {k: float(later.get(k).fitted_at[0]) for k in "abc"}  # type: ignore[union-attr]
    assert fitted["a"] == NOW - 100  # kept
    assert fitted["b"] == NOW + 30  # too old: refitted
    assert fitted["c"] == NOW + 30  # never fitted


def test_between_refits_new_observations_still_move_the_forecast() -> None:
    cfg = ForecastConfig()
    base = 50 + np.sin(np.arange(7200) / 400) * 10
    first, states = forecast([_series(base)], cfg, NOW, keys=["s"])
    moved = np.concatenate([base[60:], np.full(60, 90.0)])  # 30 s later, load jumped
    second, later = forecast([_series(moved)], cfg, NOW + 30, states, keys=["s"])
    before, after = states.get("s"), later.get("s")
    assert before is not None and after is not None
    assert after.fitted_at[0] == before.fitted_at[0]  # not refitted
    assert first[0].forecast is not None and second[0].forecast is not None
    assert second[0].forecast.mean[0] > first[0].forecast.mean[0] + 5


# one grid: bucketed together; different lengths: one by one, right-aligned
@pytest.mark.parametrize("lengths", [(725, 725, 725), (725, 700, 13)])
def test_series_are_bucketed_as_rows_like_one_by_one(lengths: tuple[int, ...]) -> None:
    rng = np.random.default_rng(2)
    series = []
    for n in lengths:
        values = rng.normal(50, 5, n)
        values[rng.random(n) < 0.1] = np.nan
        series.append(Series(NOW - 0.5 * (n - 1), 0.5, values))
    rows = bucket_rows(series, 10.0, NOW + 1.0)
    for r, s in enumerate(series):
        one = bucket(s, 10.0, NOW + 1.0)
        np.testing.assert_array_equal(rows[r, rows.shape[1] - len(one) :], one)
        assert np.isnan(rows[r, : rows.shape[1] - len(one)]).all()
