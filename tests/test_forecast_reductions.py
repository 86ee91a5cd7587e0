"""The assessment's exact reductions (`reductions`) against the numpy calls they stand for."""

from __future__ import annotations

import warnings

import numpy as np

from gpuscaler.core.forecast.ensemble import origins_for
from gpuscaler.core.forecast.reductions import (
    finite_counts,
    first_axis_sums,
    last_axis_nanmax,
    points_after,
)

_VALUES = [0.0, -0.0, 1.0, -1.0, np.nan, -np.nan, np.inf, -np.inf, 2.5, 1e-300]


def _arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    out = []
    for trial in range(400):
        shape = (int(rng.integers(0, 5)), int(rng.integers(0, 7)), int(rng.integers(1, 33)))
        if trial % 2:
            a = rng.choice(_VALUES, size=shape)
        else:
            a = rng.normal(size=shape)
            a[rng.random(shape) < 0.2] = np.nan
        if trial % 9 == 0:
            a[..., :] = np.nan
        out.append(a)
    return out


def test_finite_counts_equal_the_sum_of_the_flags_over_the_trailing_axes() -> None:
    for a in _arrays():
        finite = np.isfinite(a)
        for axes in (1, 2):
            want = finite.sum(axis=tuple(range(axes, 3)))
            got = finite_counts(finite, axes)
            assert got.dtype == want.dtype and got.shape == want.shape
            assert (got == want).all()


def test_finite_counts_read_a_strided_view_by_its_logical_order() -> None:
    a = np.arange(2 * 3 * 8, dtype=float).reshape(2, 3, 8)
    a[0, 1, 2] = a[1, 2, 5] = np.nan
    view = np.isfinite(a).transpose(1, 0, 2)[:, :, ::2]
    assert (finite_counts(view, 1) == view.sum(axis=(1, 2))).all()


def test_last_axis_nanmax_is_nanmax_bit_for_bit_with_zeros_of_both_signs_and_nan() -> None:
    for a in _arrays():
        if not a.size:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want = np.nanmax(a, axis=2)
        got = last_axis_nanmax(a)
        assert got.shape == want.shape and got.tobytes() == want.tobytes()


def test_last_axis_nanmax_of_a_strided_view_is_nanmax_of_it() -> None:
    a = np.random.default_rng(3).normal(size=(4, 5, 12))
    view = a[:, ::2, 1:]
    assert last_axis_nanmax(view).tobytes() == np.nanmax(view, axis=2).tobytes()


def test_first_axis_sums_are_numpys_contiguous_sums_bit_for_bit() -> None:
    rng = np.random.default_rng(11)
    for trial in range(300):
        shape = (int(rng.integers(0, 40)), int(rng.integers(1, 30)), int(rng.integers(0, 140)))
        a = rng.normal(size=shape) * 10.0 ** rng.integers(-8, 8, size=shape)
        if trial % 3 == 0:  # zeros of both signs, NaN of one sign (no inf - inf), overflow
            a = rng.choice([0.0, -0.0, 1.0, np.nan, np.inf, 1e308, 3e-5, -2.0], size=shape)
        with np.errstate(all="ignore"):
            want = np.ascontiguousarray(a).sum(axis=-1)
            got = first_axis_sums(np.moveaxis(a, -1, 0))
        assert got.shape == want.shape and got.tobytes() == want.tobytes()


def test_first_axis_sums_differ_from_numpy_at_most_in_a_nan_s_sign() -> None:
    rng = np.random.default_rng(12)
    for _ in range(100):
        shape = (int(rng.integers(1, 20)), int(rng.integers(1, 9)), int(rng.integers(1, 70)))
        a = rng.choice([np.nan, -np.nan, np.inf, -np.inf, 1.0, -2.5], size=shape)
        with np.errstate(invalid="ignore"):
            want = np.ascontiguousarray(a).sum(axis=-1)
            got = first_axis_sums(np.moveaxis(a, -1, 0))
        assert np.array_equal(got, want, equal_nan=True)


def test_first_axis_sums_of_columns_longer_than_a_pairwise_block_are_numpys_own() -> None:
    a = np.random.default_rng(13).normal(size=(300, 4, 3))
    assert first_axis_sums(a).tobytes() == np.moveaxis(a, 0, -1).copy().sum(axis=-1).tobytes()


def test_points_after_evenly_spaced_or_not_origins_are_the_gathered_windows() -> None:
    hist = np.random.default_rng(14).normal(size=(5, 200))
    hist[:, -1] = np.nan
    for steps in (1, 7, 30):
        for origins in (
            origins_for(200, steps, 12),
            np.array([3, 4, 9, 20]),
            np.array([15]),
            np.array([0, 5, 10]),
        ):
            want = np.ascontiguousarray(
                np.lib.stride_tricks.sliding_window_view(hist, steps, axis=1)[:, origins + 1]
            )
            got = points_after(hist, origins, steps)
            assert got.flags.c_contiguous and got.shape == want.shape
            assert got.tobytes() == want.tobytes()
