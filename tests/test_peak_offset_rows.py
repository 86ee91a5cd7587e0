"""The peak offset of rows whose recent peak errors are all finite (the steady state) is
found with one count for all rows (issue 20); the offsets are, bit for bit, those of
counting each row's errors (the code before, kept here as the oracle)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.core.forecast.widths import PEAK_QUANTILE, peak_offset
from gpuscaler.core.model import FloatArray


def offset_before(peak_errors: FloatArray) -> FloatArray:
    """`peak_offset` as it was at 6bdd6d1, one row at a time in Python floats (the oracle:
    the same IEEE operations on each row's own count of finite errors)."""
    out = []
    for errors in peak_errors:
        ordered = np.sort(errors).tolist()  # NaN last, as the batch sorts it
        count = int(np.isfinite(errors).sum())
        if not count:
            out.append(0.0)
            continue
        pos = PEAK_QUANTILE * (count - 1)
        lo = math.floor(pos)
        part = pos - lo
        out.append(ordered[lo] * (1 - part) + ordered[min(lo + 1, count - 1)] * part)
    return np.array(out, dtype=np.float64)


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
