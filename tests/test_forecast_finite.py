"""A batch finds whether each of its forecasts is finite at once and keeps it on the
forecast (issue 20); the kept answer is the one each forecast's own arrays give."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from builders import NOW

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast import forecast_series
from gpuscaler.core.model import Forecast, Series, mark_finite


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
    signals = forecast_series([_series(r) for r in rows], ForecastConfig(), NOW)
    made = [s.forecast for s in signals if s.forecast is not None]
    assert len(made) >= 4
    answers = [f.is_finite() for f in made]
    assert answers == [_checked(f) for f in made]
    assert any(answers) and not all(answers)  # the huge row is not finite
    for s in signals:
        if s.forecast is not None:
            assert (s.problem is None) == s.forecast.is_finite()


@pytest.mark.parametrize("bad", ["mean", "lower", "upper"])
def test_a_kept_answer_is_what_the_arrays_say_and_a_changed_forecast_checks_again(
    bad: str,
) -> None:
    arrays = {k: np.array([1.0, 2.0]) for k in ("mean", "lower", "upper")}
    arrays[bad][1] = np.inf
    for a in arrays.values():
        a.flags.writeable = False
    mean, lower, upper = arrays["mean"], arrays["lower"], arrays["upper"]
    f = Forecast(NOW, 10.0, mean, lower, upper, 0.9, "m", "r", 1.0)
    mark_finite([f], [False])
    assert f.is_finite() is False
    fixed = np.array([1.0, 2.0])
    fixed.flags.writeable = False
    arrays[bad] = fixed
    again = dataclasses.replace(
        f, mean=arrays["mean"], lower=arrays["lower"], upper=arrays["upper"]
    )
    assert again.is_finite() is True  # made anew: checked, not the kept answer


def test_a_forecast_whose_arrays_can_still_change_keeps_no_answer() -> None:
    a = np.array([1.0])
    f = Forecast(NOW, 10.0, a, a, a, 0.9, "m", "r", 1.0)
    with pytest.raises(AssertionError):
        mark_finite([f], [True])
    assert f.is_finite() is True and "_finite" not in vars(f)
