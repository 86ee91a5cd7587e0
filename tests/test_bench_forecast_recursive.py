"""The recursive forecaster of bench/recursive_forecaster.py (a study, issue 20)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
from recursive_forecaster import Paths, RecursiveForecaster


def _fed(values: np.ndarray, steps: int = 30) -> Paths:
    model = RecursiveForecaster(values.shape[0], steps)
    out = model.update(values[:, 0])
    for j in range(1, values.shape[1]):
        out = model.update(values[:, j])
    return out


def test_a_constant_series_is_forecast_as_that_constant_with_a_zero_width_interval() -> None:
    out = _fed(np.full((3, 200), 42.5))
    assert np.allclose(out.mean, 42.5)
    assert np.all(out.upper - out.lower < 1e-6)
    assert np.allclose(out.peak, 42.5)


def test_a_linear_ramp_is_followed_ahead() -> None:
    t = np.arange(300, dtype=float)
    values = np.stack([10.0 + 0.5 * t, 80.0 - 0.2 * t])
    out = _fed(values)
    ahead = np.arange(1, 31)
    want = np.stack([10.0 + 0.5 * (299 + ahead), 80.0 - 0.2 * (299 + ahead)])
    assert np.allclose(out.mean, want, atol=0.05)
    assert np.all(out.lower <= out.mean + 1e-9) and np.all(out.mean <= out.upper + 1e-9)


def test_rows_are_independent_and_a_missing_bucket_holds_the_last_value() -> None:
    rng = np.random.default_rng(3)
    values = 50.0 + np.cumsum(rng.normal(0, 1, (2, 150)), axis=1)
    alone = _fed(values[:1])
    values[1, 70] = np.nan
    both = _fed(values)
    assert np.allclose(both.mean[0], alone.mean[0])
    assert np.all(np.isfinite(both.mean)) and np.all(np.isfinite(both.upper))
