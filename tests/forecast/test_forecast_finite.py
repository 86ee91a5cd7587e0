"""A forecast that is not finite (an overflowing interval) is flagged as a problem on its
signal, so it never reaches a decision."""

from __future__ import annotations

import dataclasses

import numpy as np
from builders import NOW

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast import forecast
from gpuscaler.core.model import Forecast, Series


def _series(values: np.ndarray) -> Series:
    return Series(NOW - (len(values) - 1), 1.0, values)


def _checked(f: Forecast) -> bool:
    """`is_finite` of the same forecast made anew (nothing kept): its arrays checked."""
    return dataclasses.replace(f).is_finite()


def test_every_forecast_of_a_batch_is_finite_as_its_own_arrays_say() -> None:
    rng = np.random.default_rng(5)
    t = 7200
    rows = [
        50 + np.cumsum(rng.normal(0, 1, t)),  # a walk
        np.full(t, 30.0),  # flat
        np.concatenate([np.full(t - 300, np.nan), rng.uniform(0, 100, 300)]),  # young
        rng.uniform(0, 1.7e308, t),  # huge: its interval overflows
        np.where(rng.random(t) < 0.2, np.nan, rng.uniform(0, 100, t)),  # gaps
    ]
    signals, _ = forecast([_series(r) for r in rows], ForecastConfig(), NOW)
    made = [s.forecast for s in signals if s.forecast is not None]
    assert len(made) >= 4
    answers = [f.is_finite() for f in made]
    assert answers == [_checked(f) for f in made]
    assert any(answers) and not all(answers)  # the huge row is not finite
    for s in signals:
        if s.forecast is not None:
            assert (s.problem is None) == s.forecast.is_finite()
