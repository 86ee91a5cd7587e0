"""Issue 20: the ensemble's weighted mean (`combine`) takes flat members at the shape they
are (n, ..., 1), broadcast beside the full ones, and builds its sums without a full-size
temporary a member. The oracle is the mean as it was made before (every member's weight
and part at the full shape, summed from zeros), compared bit for bit, gaps, NaN and
infinite weights, zeros of either sign and subnormal values included."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.core.forecast.ensemble import MEMBERS, combine
from gpuscaler.core.model import FloatArray

VALUES = np.array([0.0, -0.0, 1.5, -2.25, 7.0, np.nan, np.inf, -np.inf, 1e-310, 3.0])
WEIGHTS = np.array([0.0, -0.0, 0.25, 1.0, 0.5, np.nan, np.inf, 2.0])


def _before(weights: Mapping[str, FloatArray], paths: Mapping[str, FloatArray]) -> FloatArray:
    """`combine` as it was: full-size paths only."""
    first = paths[MEMBERS[0]]
    shape = (-1,) + (1,) * (first.ndim - 1)
    total, wsum = np.zeros(first.shape), np.zeros(first.shape)
    for name in MEMBERS:
        path = paths[name]
        w = np.where(np.isfinite(path), weights[name].reshape(shape), 0.0)
        total += np.where(w > 0, w * path, 0.0)
        wsum += w
    with np.errstate(invalid="ignore", divide="ignore"):
        out: FloatArray = np.where(wsum > 0, total / wsum, np.nan)
    return out


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.integers(0, 10_000), st.integers(1, 4), st.integers(1, 3), st.booleans())
def test_flat_members_broadcast_give_the_mean_of_them_repeated_bit_for_bit(
    seed: int, n: int, steps: int, origins: bool
) -> None:
    rng = np.random.default_rng(seed)
    lead = (n, 3) if origins else (n,)
    flat = {k: rng.choice(VALUES, size=(*lead, 1)) for k in MEMBERS}
    flat["arima"] = rng.choice(VALUES, size=(*lead, steps))
    if rng.random() < 0.3:  # a gapless, positively weighted full member
        flat["arima"] = np.abs(rng.normal(size=(*lead, steps)))
    weights = {k: rng.choice(WEIGHTS, size=n) for k in MEMBERS}
    if rng.random() < 0.3:
        weights = {k: rng.uniform(0.1, 1.0, n) for k in MEMBERS}
    full = {k: np.broadcast_to(v, flat["arima"].shape).copy() for k, v in flat.items()}
    with np.errstate(all="ignore"):
        want = _before(weights, full)
        got_flat, got_full = combine(weights, flat), combine(weights, full)
    assert got_flat.shape == want.shape
    assert got_flat.tobytes() == want.tobytes()
    assert got_full.tobytes() == want.tobytes()
