"""Issue 20: the ensemble's weighted mean (`combine`) takes flat members at the shape they
are (n, ..., 1), broadcast beside the full ones, and builds its sums without a full-size
temporary a member; `normalized` scales the members' weights as rows of one array. The
oracles are the mean and the weights as they were made before (every member's weight and
part at the full shape, summed from zeros; the weights member by member), compared bit
for bit, gaps, NaN and infinite weights, zeros of either sign and subnormals included."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.core.forecast.ensemble import _OTHERS, ARIMA_MARGIN, MEMBERS, combine, normalized
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


def _weights_before(
    raw: Mapping[str, FloatArray], live: Mapping[str, FloatArray]
) -> dict[str, FloatArray]:
    """`normalized` as it was: member by member."""
    kept = {k: np.where(np.isfinite(live[k]).all(axis=1), raw[k], 0.0) for k in MEMBERS}
    arima = kept["arima"]
    has = arima > 0
    for name in MEMBERS[1:]:
        lead = kept[name] / np.where(has, arima, 1.0) - 1.0
        gate = np.clip(lead / ARIMA_MARGIN, 0.0, 1.0)
        kept[name] = np.where(has, kept[name] * gate, kept[name])
    total = sum(kept.values())
    return {k: np.where(total > 0, v / total, 0.0) for k, v in kept.items()}


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


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.integers(0, 10_000), st.integers(1, 5))
def test_weights_normalized_together_equal_those_normalized_member_by_member(
    seed: int, n: int
) -> None:
    rng = np.random.default_rng(seed)
    near = np.array([0.0, 1e-3, 0.25, 0.98, 1.0, 1.01, 1.02, 2.0, np.inf, np.nan])
    raw = {k: rng.choice(near, size=n) for k in MEMBERS}
    live = {k: rng.choice(VALUES, size=(n, 1 if k != "arima" else 3)) for k in MEMBERS}
    with np.errstate(all="ignore"):
        want, got = _weights_before(raw, live), normalized(raw, live)
    assert list(got) == list(want)
    for k in MEMBERS:
        assert got[k].tobytes() == want[k].tobytes()


def test_arima_is_the_first_member_so_the_others_are_the_rows_after_it() -> None:
    # _toward_arima reads the other members' weights as the rows after ARIMA's (a view)
    assert MEMBERS[0] == "arima"
    assert list(MEMBERS[_OTHERS]) == [k for k in MEMBERS if k != "arima"]
