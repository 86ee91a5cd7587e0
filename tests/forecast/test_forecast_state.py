"""The forecaster as a function of (windows, state, config, now): what a series gets does
not depend on the batch it is in, its state carries the refit and the scoring from tick to
tick, and rolling the scoring on between refits tracks scoring afresh."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import replace

import numpy as np
import pytest
from builders import NOW
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast import EMPTY, ForecastState, forecast, merged
from gpuscaler.core.model import Series, Signal

CFG = ForecastConfig()


def _series(values: np.ndarray, end: float = NOW, step: float = 10.0) -> Series:
    return Series(end - step * (len(values) - 1), step, values)


def _load(seed: int, n: int = 720) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return 50 + 20 * np.sin(t / 90 + seed) + np.cumsum(rng.normal(0, 0.5, n)) + rng.normal(0, 3, n)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 1000), st.integers(2, 6))
def test_a_series_in_a_batch_gets_the_forecast_it_gets_alone(seed: int, n: int) -> None:
    rows = [_load(seed + k) for k in range(n)]
    together, _ = forecast([_series(r) for r in rows], CFG, NOW)
    for r, signal in zip(rows, together, strict=True):
        (alone,), _ = forecast([_series(r)], CFG, NOW)
        assert signal.forecast is not None and alone.forecast is not None
        np.testing.assert_allclose(signal.forecast.mean, alone.forecast.mean, rtol=1e-9)
        np.testing.assert_allclose(signal.forecast.upper, alone.forecast.upper, rtol=1e-9)
        assert signal.forecast.method == alone.forecast.method


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 1000), st.floats(0.0, 80.0), st.floats(1.0, 50.0))
def test_every_forecast_lies_within_its_clip_and_its_interval_holds_its_path(
    seed: int, low: float, width: float
) -> None:
    clip = (low, low + width)
    (signal,), _ = forecast([_series(_load(seed))], CFG, NOW, clips=[clip])
    f = signal.forecast
    assert f is not None
    for path in (f.mean, f.lower, f.upper):
        assert (path >= clip[0]).all() and (path <= clip[1]).all()
    assert (f.lower <= f.mean).all() and (f.mean <= f.upper).all()
    assert clip[0] <= f.peak <= clip[1]


def test_the_state_keeps_the_fit_until_refit_every_and_only_the_keys_asked_for() -> None:
    values = _load(1, 1200)
    state = EMPTY
    fitted = []
    for k in range(360, 480, 3):  # 20 minutes of 30 s ticks
        now = NOW + 10.0 * k
        _, state = forecast([_series(values[k - 360 : k], now)], CFG, now, state, keys=["a"])
        (rows,) = state.batches
        assert rows.keys == ("a",)
        fitted.append(float(rows.fitted_at[0]))
    refits = sorted(set(fitted))
    assert len(refits) == 4  # every 5 minutes
    assert np.diff(refits).min() >= CFG.refit_every


def test_errors_rolled_on_between_refits_track_a_fresh_scoring() -> None:
    """Ten minutes after a refit the kept scoring's interval, rolled on every tick, is
    within a tolerance of the one a fresh scoring of the same window gives."""
    values = _load(7, 1200)
    state = EMPTY
    for k in range(360, 420, 3):
        now = NOW + 10.0 * k
        (rolled,), state = forecast([_series(values[k - 360 : k], now)], CFG, now, state, ["s"])
    (kept,) = state.batches
    assert kept.scorings.scored[0] and kept.fitted_at[0] < now
    fresh_state = ForecastState((replace(kept, fitted_at=np.array([-1e9])),))
    (fresh,), _ = forecast([_series(values[k - 360 : k], now)], CFG, now, fresh_state, ["s"])
    assert rolled.forecast is not None and fresh.forecast is not None
    half_rolled = rolled.forecast.upper - rolled.forecast.mean
    half_fresh = fresh.forecast.upper - fresh.forecast.mean
    assert np.median(half_rolled) == pytest.approx(np.median(half_fresh), rel=0.35)


def test_a_young_window_takes_the_models_path_and_says_so() -> None:
    cfg = ForecastConfig(min_history="2m")  # 12 buckets: too few origins to score
    (signal,), state = forecast([_series(_load(3, 40))], cfg, NOW, keys=["y"])
    assert signal.forecast is not None
    assert signal.forecast.reason == "arima(5,1,0) fit, too little history to assess"
    (rows,) = state.batches
    assert not rows.scorings.scored[0]  # scored again next tick


def test_a_series_state_is_found_in_any_batch_in_any_order_and_a_new_key_starts_fresh() -> None:
    values = {k: _load(seed, 1200) for seed, k in enumerate("abc")}
    alone = {k: EMPTY for k in "ab"}
    for k in range(360, 420, 3):
        now = NOW + 10.0 * k
        window = {key: _series(v[k - 360 : k], now) for key, v in values.items()}
        together = merged(*alone.values())
        if k > 360:
            out, _ = forecast([window[key] for key in "bca"], CFG, now, together, list("bca"))
        for key in "ab":
            (own,), alone[key] = forecast([window[key]], CFG, now, alone[key], [key])
            if k > 360:
                _assert_same(own, out["bca".index(key)])
    (new,), _ = forecast([window["c"]], CFG, now)
    _assert_same(new, out[1])


def _assert_same(a: Signal, b: Signal) -> None:
    assert a.forecast is not None and b.forecast is not None
    np.testing.assert_allclose(a.forecast.mean, b.forecast.mean, rtol=1e-9)
    np.testing.assert_allclose(a.forecast.upper, b.forecast.upper, rtol=1e-9)
    assert a.forecast.reason == b.forecast.reason


def test_forecasting_from_a_state_leaves_that_state_as_it_was() -> None:
    values = _load(3, 1200)
    state = EMPTY
    for k in range(360, 420, 3):
        now = NOW + 10.0 * k
        before = copy.deepcopy(state)
        _, after = forecast([_series(values[k - 360 : k], now)], CFG, now, state, ["s"])
        for old, kept in zip(_arrays(state), _arrays(before), strict=True):
            np.testing.assert_array_equal(old, kept)
        state = after
    assert state.batches[0].scorings.scored[0]


def _arrays(x: object) -> list[np.ndarray]:
    out = []
    for f in dataclasses.fields(x):  # type: ignore[arg-type]
        value = getattr(x, f.name)
        if isinstance(value, np.ndarray):
            out.append(value)
        elif isinstance(value, tuple):
            out += [a for v in value if dataclasses.is_dataclass(v) for a in _arrays(v)]
        elif dataclasses.is_dataclass(value):
            out += _arrays(value)
    return out
