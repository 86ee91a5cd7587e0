"""The assessment's exact reductions (`sparse_gaps`) against the numpy calls they stand for."""

from __future__ import annotations

import warnings

import numpy as np

from gpuscaler.core.forecast.sparse_gaps import finite_counts, last_axis_nanmax

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
