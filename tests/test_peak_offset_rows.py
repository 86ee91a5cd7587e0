"""The peak offset of rows whose recent peak errors are all finite (the steady state) is
found with one count for all rows (issue 20); the offsets are, bit for bit, those of
counting each row's errors (the code before, kept here as the oracle)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.core.forecast.widths import PEAK_QUANTILE, peak_offset
from gpuscaler.core.model import FloatArray


def offset_before(peak_errors: FloatArray) -> FloatArray:
    """`peak_offset` as it was at 6bdd6d1 (the oracle)."""
    ordered = np.sort(peak_errors, axis=1)
    count = np.isfinite(peak_errors).sum(axis=1)
    pos = PEAK_QUANTILE * np.maximum(count - 1, 0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(count - 1, 0))
    rows = np.arange(peak_errors.shape[0])
    frac = pos - lo
    value = ordered[rows, lo] * (1 - frac) + ordered[rows, hi] * frac
    out: FloatArray = np.where(count > 0, value, 0.0)
    return out


@settings(max_examples=80, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 6),
    depth=st.integers(1, 30),
    odd=st.sampled_from([None, np.nan, np.inf, -np.inf]),
)
def test_peak_offsets_are_those_of_counting_each_rows_errors(
    seed: int, n: int, depth: int, odd: float | None
) -> None:
    rng = np.random.default_rng(seed)
    errors = rng.normal(0, 3, (n, depth)) * 10 ** rng.uniform(-3, 3)
    if odd is not None:
        errors[rng.random(errors.shape) < 0.2] = odd
    with np.errstate(invalid="ignore"):
        assert peak_offset(errors).tobytes() == offset_before(errors).tobytes()


def test_a_row_of_one_error_has_that_error_as_its_offset() -> None:
    errors = np.array([[2.5], [-1.0]])
    assert peak_offset(errors).tobytes() == offset_before(errors).tobytes()
    assert peak_offset(errors).tolist() == [2.5, -1.0]
