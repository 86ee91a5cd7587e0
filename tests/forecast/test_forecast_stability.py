"""Stability as a hard rule: no window, however flat or odd, gives a forecast that leaves
the window's range by more than a bounded margin."""

from __future__ import annotations

import numpy as np
from builders import NOW
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast import Arima, forecast, lead
from gpuscaler.core.forecast.arima import inverse_root_modulus
from gpuscaler.core.model import Series

POINTS = 360  # 1 h of 10 s buckets
MEAN_SPANS = 2.0
"""The path and the peak stay within the window's range widened by 2 ranges each side."""
INTERVAL_SPANS = 4.0


def _series(values: np.ndarray) -> Series:
    return Series(start=NOW - 10.0 * (len(values) - 1), step=10.0, values=values)


@st.composite
def windows(draw: st.DrawFn) -> np.ndarray:
    """Flat, near-flat, step, spike and all-zero windows, and pod-like flat ones with a
    few blips among the newest samples (the shape that exploded)."""
    kind = draw(st.sampled_from(["flat", "near_flat", "step", "spike", "zero", "blips"]))
    level = 0.0 if kind == "zero" else draw(st.floats(0.0, 100.0))
    w = np.full(POINTS, level)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if kind == "near_flat":
        w += rng.normal(0, draw(st.sampled_from([1e-9, 1e-4, 0.01])), POINTS)
    elif kind == "step":
        w[draw(st.integers(1, POINTS - 1)) :] += draw(st.floats(-50.0, 50.0))
    elif kind == "spike":
        w[draw(st.integers(0, POINTS - 1))] += draw(st.floats(-50.0, 50.0))
    elif kind == "blips":
        for _ in range(draw(st.integers(1, 3))):
            w[draw(st.integers(POINTS - 20, POINTS - 1))] += rng.normal(0, 1)
    return w


@settings(max_examples=150, deadline=None)
@given(windows())
def test_the_forecast_stays_within_the_windows_range_widened_by_a_bounded_margin(
    w: np.ndarray,
) -> None:
    (sig,), _ = forecast([_series(w)], ForecastConfig(), NOW, clips=[(-np.inf, None)])
    f = sig.forecast
    assert f is not None and sig.problem is None
    lo, hi = w.min(), w.max()
    span = max(hi - lo, 1e-6 * max(abs(hi), 1.0))
    assert lo - MEAN_SPANS * span <= f.mean.min() and f.mean.max() <= hi + MEAN_SPANS * span
    assert lo - MEAN_SPANS * span <= f.peak <= hi + MEAN_SPANS * span
    assert f.lower.min() >= lo - INTERVAL_SPANS * span
    assert f.upper.max() <= hi + INTERVAL_SPANS * span


def _pod_window() -> np.ndarray:
    """A pod's flat GPU utilization with two small blips in the newest samples: the fit on
    its differences is explosive (found among random pod-like windows)."""
    w = np.full(POINTS, 34.74164266497423)
    w[-2] += 0.08742117
    w[-1] += 1.7881035
    return w


def test_a_pod_like_flat_window_has_an_explosive_fit_that_never_reaches_the_forecast() -> None:
    w = _pod_window()
    arima = Arima(5, 1)
    fitted = arima.fit(w[None, :])
    raw = arima.predict(fitted, w[None, :], 30)
    assert inverse_root_modulus(fitted.phi)[0] > 1.0  # explosive: a root inside the circle
    assert np.abs(raw).max() > 1e6  # the path the old forecaster would have used
    for cfg in (ForecastConfig(), ForecastConfig(ensemble=False)):
        (sig,), _ = forecast([_series(w)], cfg, NOW, clips=[(0.0, 100.0)])
        f = sig.forecast
        assert f is not None and sig.problem is None
        assert "arima(5,1,0) dropped: unstable fit" in f.reason
        assert f.mean.min() >= 34.0 and f.mean.max() <= 37.0
        assert f.peak <= 37.0 and f.upper.max() <= 40.0


@settings(max_examples=60, deadline=None)
@given(windows(), windows(), st.floats(-1e6, 1e6))
def test_with_any_demand_the_forecast_stays_within_the_load_windows_band(
    load: np.ndarray, demand: np.ndarray, scale: float
) -> None:
    """A leading signal (however flat, spiky or badly scaled) never takes the load's
    forecast out of the load window's range widened by a bounded margin."""
    s = _series(load)
    (sig,), _ = forecast([s], ForecastConfig(), NOW, clips=[(-np.inf, None)])
    d = _series(demand * scale)
    f = lead(sig, s, d, ForecastConfig(), NOW, clip=(-np.inf, None))[0].forecast
    assert f is not None and np.isfinite(f.mean).all()
    lo, hi = load.min(), load.max()
    span = max(hi - lo, 1e-6 * max(abs(hi), 1.0))
    assert lo - MEAN_SPANS * span <= f.mean.min() and f.mean.max() <= hi + MEAN_SPANS * span
    assert lo - MEAN_SPANS * span <= f.peak <= hi + MEAN_SPANS * span
