"""`naive_half_width` computes every lag in one conformal call (issue 18); it must give
what one call per lag gave (the loop it replaced, kept here as the reference)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.core.forecast.intervals import conformal_half_width, naive_half_width


def _per_lag(hist: np.ndarray, steps: int, level: float) -> np.ndarray:
    n, t = hist.shape
    out = np.full((n, steps), np.nan)
    for h in range(1, min(steps, t - 1) + 1):
        err = np.abs(hist[:, h:] - hist[:, : t - h])[:, :, None]
        out[:, h - 1] = conformal_half_width(err, np.full(n, level))[:, 0]
    filled = np.fmax.accumulate(np.where(np.isfinite(out), out, -np.inf), axis=1)
    return np.where(np.isfinite(filled), filled, np.nan)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 4),
    t=st.integers(1, 40),
    steps=st.integers(1, 35),
    level=st.floats(0.05, 0.99),
    gaps=st.floats(0.0, 0.5),
    seed=st.integers(0, 2**32 - 1),
)
def test_all_lags_at_once_equal_one_call_per_lag(
    n: int, t: int, steps: int, level: float, gaps: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    hist = rng.normal(50, 10, (n, t))
    hist[rng.random((n, t)) < gaps] = np.nan
    assert np.array_equal(
        naive_half_width(hist, steps, level), _per_lag(hist, steps, level), equal_nan=True
    )


@pytest.mark.parametrize("t", [0, 1])
def test_too_short_a_history_has_no_interval(t: int) -> None:
    assert np.isnan(naive_half_width(np.ones((2, t)), 5, 0.7)).all()
