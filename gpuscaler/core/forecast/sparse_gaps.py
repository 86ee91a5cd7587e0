"""Exact reductions of an assessment's (series, origins, steps) arrays that numpy runs
slowly along a short last axis (issue 20: ~0.1 us of loop set-up per row of ~30 steps,
6,000 rows a refit).

Counts of finite values are integers, found from the few gaps (a window's open bucket
and a few others) instead of summing every flag; maxima are selections, found along
the first axis of a transposed copy (numpy's fast direction) and taken again the usual
way for the rows whose maximum is a zero (0.0 and -0.0 compare equal, and which of them
numpy returns depends on the order it compares) or NaN (none finite: which NaN depends
on the order too). Every other maximum is the one value of the row equal to it.
"""

from __future__ import annotations

import numpy as np

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
