"""Issue 20: buckets of one point each (the simulator's slot is the fit step) are found
without the general reshape, bit for bit its means; the fit's usable windows without an
isfinite of every window's every point; each row's last finite value from the newest
columns first."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from gpuscaler.core.forecast.buckets import _bucket_means
from gpuscaler.core.forecast.engines import _all_finite, last_finite


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("offset", [-2, -1, 0, 1, 3])
def test_one_point_buckets_are_the_general_means_of_the_point_and_a_gap(
    seed: int, offset: int
) -> None:
    """The general path sums each bucket from 0.0 over its finite points and divides by
    their count: a point alone and a point after a gap, half as wide a step apart, give
    the same means (-0.0 summed to 0.0, infinities and NaN to NaN)."""
    rng = np.random.default_rng(seed)
    values = rng.normal(0, 3, (3, 25))
    pick = rng.random(values.shape)
    values[pick < 0.1] = np.nan
    values[(pick > 0.1) & (pick < 0.15)] = np.inf
    values[(pick > 0.15) & (pick < 0.25)] = -0.0
    values[(pick > 0.25) & (pick < 0.28)] = -np.inf
    halves = np.full((3, 50), np.nan)
    halves[:, 1::2] = values  # each point at its bucket's end, a gap before it
    last = 1000.0
    got = _bucket_means(values, 10.0, last, 10.0, last + offset * 10.0)
    want = _bucket_means(halves, 5.0, last, 10.0, last + offset * 10.0)
    assert got.shape == want.shape and got.tobytes() == want.tobytes()
    row = _bucket_means(values[1], 10.0, last, 10.0, last + offset * 10.0)
    assert row.tobytes() == want[1].tobytes()


@pytest.mark.parametrize("width", [1, 2, 6])
def test_runs_found_finite_point_by_point_are_the_runs_whose_every_point_is(width: int) -> None:
    """The fit's usable windows (`_all_finite`): and-ing each point's finiteness over a
    run is the finiteness of the run's every point, NaN and infinities alike."""
    rng = np.random.default_rng(width)
    z = rng.normal(0, 1, (4, 30))
    z[rng.random(z.shape) < 0.1] = np.nan
    z[rng.random(z.shape) < 0.05] = -np.inf
    want = np.isfinite(sliding_window_view(z, width, axis=1)).all(axis=2)
    got = _all_finite(z, width)
    assert got.dtype == bool and np.array_equal(got, want)


@pytest.mark.parametrize("seed", range(8))
def test_the_last_finite_value_read_from_the_newest_columns_is_the_searched_one(
    seed: int,
) -> None:
    """`last_finite` reads the newest columns one at a time, then searches the rows left:
    each row's value is the one a search of all its points finds (NaN for none), with
    gaps and infinities anywhere, -0.0, reversed and strided views."""
    rng = np.random.default_rng(seed)
    hist = rng.normal(0, 1, (7, 3 + seed))
    pick = rng.random(hist.shape)
    hist[pick < 0.5 * rng.random()] = np.nan
    hist[(pick > 0.5) & (pick < 0.6)] = np.inf
    hist[(pick > 0.6) & (pick < 0.7)] = -0.0
    hist[2] = np.nan
    hist[3, -6:] = np.nan
    for h in (hist, hist[:, ::-1], hist[::-1, ::2]):
        finite = np.isfinite(h)
        at = h.shape[1] - 1 - np.argmax(finite[:, ::-1], axis=1)
        want = np.where(finite.any(axis=1), h[np.arange(h.shape[0]), at], np.nan)
        assert last_finite(h).tobytes() == want.tobytes()
