"""The conformal half width from sorted errors counts the finite ones per row and step
only where the sorted ends are not both finite (issue 20); the half widths are, bit for
bit, those of counting every error (the code before, kept here as the oracle)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.core.forecast.intervals import MIN_RESIDUALS, ranked_half_width
from gpuscaler.core.model import FloatArray


def ranked_before(ordered: FloatArray, level: FloatArray) -> FloatArray:
    """`ranked_half_width` as it was at ed31a8e."""
    count = np.isfinite(ordered).sum(axis=1)
    rank = np.ceil((count + 1) * level[:, None]).astype(np.int64)
    idx = np.clip(np.minimum(rank, count) - 1, 0, None)
    out: FloatArray = np.take_along_axis(ordered, idx[:, None, :], axis=1)[:, 0, :]
    return np.where(count >= MIN_RESIDUALS, out, np.nan)


def _same(ordered: FloatArray, level: FloatArray) -> None:
    assert ranked_half_width(ordered, level).tobytes() == ranked_before(ordered, level).tobytes()


@pytest.mark.parametrize(
    "column",
    [
        [1.0] * 10,
        [0.5, 1.0, 2.0, np.nan],
        [-np.inf, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],  # finite last, not first
        [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, np.inf],  # an infinite last
        [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, np.inf, np.nan],
        [np.nan] * 9,
        [-0.0, 0.0, 1.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0],
        [float(v) for v in range(12)] + [np.nan] * 7,  # more missing than the tail checked
        [float(v) for v in range(10)] + [np.nan] * 6,  # as many as the tail checked
        [float(v) for v in range(10)] + [np.inf] + [np.nan] * 4,  # fewer
        [-np.inf] + [float(v) for v in range(12)] + [np.nan] * 2,  # not the first
    ],
)
def test_a_table_of_sorted_columns_gives_the_half_widths_of_counting_every_error(
    column: list[float],
) -> None:
    block = np.array(column, dtype=np.float64).reshape(1, len(column), 1)
    for level in (0.05, 0.5, 0.9, 0.995):
        _same(np.repeat(block, 3, axis=2), np.array([level]))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 6),
    depth=st.integers(1, 20),
    steps=st.integers(1, 5),
    holes=st.floats(0.0, 0.6),
)
def test_generated_sorted_errors_give_the_half_widths_of_counting_every_error(
    seed: int, n: int, depth: int, steps: int, holes: float
) -> None:
    rng = np.random.default_rng(seed)
    errors = np.abs(rng.normal(0, 5, (n, depth, steps)))
    errors[rng.random(errors.shape) < holes] = np.nan
    errors[rng.random(errors.shape) < 0.03] = np.inf
    errors[rng.random(errors.shape) < 0.03] = -np.inf
    ordered = np.sort(errors, axis=1)  # NaN last
    _same(ordered, rng.uniform(0.05, 0.995, n))
    # the kept errors' layout: (n, steps, origins) blocks read as (n, origins, steps)
    _same(np.ascontiguousarray(ordered.transpose(0, 2, 1)).transpose(0, 2, 1), np.full(n, 0.9))
