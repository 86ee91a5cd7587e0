"""Exact reductions that numpy runs slowly along a short last axis, found in fewer, wider
numpy calls (issue 20: ~0.1 us of loop set-up per row; an assessment sums and takes the
maxima of ~6,000 rows of 30 steps and of 11 smoothing constants a refit).

- Counts of finite values are integers, found from the few gaps (a window's open bucket
  and a few others) instead of summing every flag.
- Maxima are selections, found along the first axis of a transposed copy (numpy's fast
  direction) and taken again the usual way for the rows whose maximum is a zero (0.0 and
  -0.0 compare equal, and which of them numpy returns depends on the order it compares)
  or NaN (none finite: which NaN, the order too). Any other maximum is the one value of
  its row equal to it.
- Sums of up to PAIRWISE_BLOCK values are numpy's own pairwise summation of a contiguous
  run (`DOUBLE_pairwise_sum`, numpy/_core/src/umath/loops_utils.h.src: eight running
  sums of every eighth value, added as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)),
  then the rest one by one; below eight values one by one from 0.0), added to the
  reduction's start 0.0: the same additions in the same order, each over every row at
  once (tests/test_forecast_reductions.py checks them bit for bit against numpy's sum).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from gpuscaler.core.model import BoolArray, FloatArray, IntArray


def finite_counts(finite: BoolArray, axes: int) -> IntArray:
    """`finite.sum` over all but the first `axes` axes (intp), from the positions of
    the values that are not finite."""
    lead = finite.shape[:axes]
    per = int(np.prod(finite.shape[axes:], dtype=np.intp))
    rows = int(np.prod(lead, dtype=np.intp))
    if not per or not rows:
        out: IntArray = np.zeros(lead, dtype=np.intp)
        return out
    missing = np.bincount(np.flatnonzero(~finite) // per, minlength=rows)
    counts: IntArray = (per - missing).astype(np.intp, copy=False).reshape(lead)
    return counts


def last_axis_nanmax(a: FloatArray) -> FloatArray:
    """`np.nanmax(a, axis=-1)` of a C-contiguous 3-d array (any other: the same call),
    without its warning for a row of NaN."""
    if not a.size or not a.flags.c_contiguous:
        out: FloatArray = np.fmax.reduce(a, axis=-1)
        return out
    fast: FloatArray = np.fmax.reduce(np.ascontiguousarray(np.moveaxis(a, -1, 0)), axis=0)
    redo = (fast == 0.0) | np.isnan(fast)
    if redo.any():
        fast[redo] = np.fmax.reduce(a[redo], axis=-1)
    return fast


PAIRWISE_BLOCK = 128
"""numpy sums a contiguous run of more values in halves (`PW_BLOCKSIZE`): not mirrored."""


def first_axis_sums(a: FloatArray) -> FloatArray:
    """`a.sum(axis=0)` of a float64 array (m, ...) each column summed as numpy sums a
    contiguous run of m values (a new array; `a` may be any view)."""
    m = a.shape[0]
    if m > PAIRWISE_BLOCK or a.ndim < 2 or a.dtype != np.float64:
        out: FloatArray = np.ascontiguousarray(np.moveaxis(a, 0, -1)).sum(axis=-1)
        return out
    if m < 8:
        res = np.zeros(a.shape[1:])
        for i in range(m):
            res += a[i]
        return np.add(0.0, res, out=res)
    r = a[:8].copy()
    top = m - m % 8
    for i in range(8, top, 8):
        r += a[i : i + 8]
    for j in (0, 2, 4, 6):  # ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        r[j] += r[j + 1]
    r[0] += r[2]
    r[4] += r[6]
    r[0] += r[4]
    res = r[0]
    for i in range(top, m):
        res += a[i]
    total: FloatArray = np.add(0.0, res)
    return total


def points_after(hist: FloatArray, origins: IntArray, steps: int) -> FloatArray:
    """The `steps` points after each origin (n, len(origins), steps), row-major: numpy's
    fancy index lays the rows out innermost, so sums over a row would run in an order
    that depends on how many rows there are. Evenly spaced origins (an assessment's)
    are a strided slice of the windows' view, copied once (issue 20: its gather by the
    origins' index cost ~10-30x the copy); others, one gather of the view."""
    windows = sliding_window_view(hist, steps, axis=1)
    spacing = np.diff(origins)
    if spacing.size and spacing[0] > 0 and origins[0] >= 0 and (spacing == spacing[0]).all():
        first, last, step = int(origins[0]) + 1, int(origins[-1]) + 2, int(spacing[0])
        out: FloatArray = np.ascontiguousarray(windows[:, first:last:step])
        return out
    return np.ascontiguousarray(windows[:, origins + 1])


def row_sums(a: FloatArray) -> FloatArray:
    """Sums over the last axis, each row summed contiguously (pairwise) whatever the
    layout numpy gave `a`: the same for a series alone and in a batch (`column_sums`)."""
    return first_axis_sums(np.moveaxis(a, -1, 0))


def column_sums(a: FloatArray) -> FloatArray:
    """Sums over the first axis of (A, n, ...), each column summed as it is alone (numpy
    sums a contiguous run pairwise but adds strided rows one after another, so a plain
    `sum(axis=0)` of one series differs in the last bits from the same series in a
    batch): a series' figures do not depend on the batch it is forecast in (issue 20's
    lockstep replay)."""
    return first_axis_sums(a)
