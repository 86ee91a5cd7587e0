"""The conformal half widths and the peak's offset from recent errors (split from
`intervals`, which re-exports them): with n recent absolute errors at a step, the half
width at level L is the ceil((n + 1) L)-th smallest (the small-sample rank correction;
the largest when that rank exceeds n).
"""

from __future__ import annotations

import math

import numpy as np

from gpuscaler.core.model import FloatArray, IntArray

MIN_RESIDUALS = 8
"""Fewer recent errors than this at a step: no conformal interval from them."""
PEAK_QUANTILE = 0.5
"""The peak adds this quantile of the recent peak errors (the median: least absolute
error of the peak)."""


def conformal_half_width(abs_resid: FloatArray, level: FloatArray) -> FloatArray:
    """Half width (n, steps) from absolute errors (n, origins, steps) at per-row `level`
    (n,); NaN at a step with fewer than MIN_RESIDUALS finite errors."""
    return ranked_half_width(np.sort(abs_resid, axis=1), level)  # NaN sorts last


def ranked_half_width(ordered: FloatArray, level: FloatArray) -> FloatArray:
    """`conformal_half_width` from absolute errors already sorted along the origins
    (n, origins, steps; NaN last): kept between refits, only the level moves."""
    n, _, steps = ordered.shape
    count = _finite_counts(ordered)  # (n, steps)
    rank = np.ceil((count + 1) * level[:, None]).astype(np.int64)
    idx = np.maximum(np.minimum(rank, count) - 1, 0)
    out = ordered[np.arange(n)[:, None], idx, np.arange(steps)]  # each row and step's rank
    return np.where(count >= MIN_RESIDUALS, out, np.nan)


_TAIL = 6
"""The last errors of each row and step that `_finite_counts` checks one by one."""


def _finite_counts(ordered: FloatArray) -> IntArray:
    """Finite errors of each row and step (n, steps) of errors sorted along the origins
    (-inf first, NaN last): every error before the last `_TAIL` is finite where the first
    one and the `_TAIL`-th from last are (it lies between two finite ones in order), so
    only those last are checked, one origin at a time (issue 20: kept errors are nearly
    all finite, bar a few newest origins at the far steps; a reduction over the origins
    of a block stored step by step cost some 3 times as much); the rows and steps
    without both are counted whole."""
    by_step = ordered.swapaxes(1, 2)  # (n, steps, origins): the kept blocks' own order
    depth = ordered.shape[1]
    cut = max(depth - _TAIL, 0)
    count: IntArray = np.full(by_step.shape[:2], cut, dtype=np.int64)
    for at in range(cut, depth):
        count += np.isfinite(by_step[:, :, at])
    if cut:
        known = np.isfinite(by_step[:, :, 0]) & np.isfinite(by_step[:, :, cut])
        if not known.all():
            rows, steps = np.nonzero(~known)
            count[rows, steps] = np.isfinite(ordered[rows, :, steps]).sum(axis=1)
    return count


def naive_half_width(hist: FloatArray, steps: int, level: float) -> FloatArray:
    """Half width (n, steps) of the last value's interval: the conformal quantile of its
    own errors |y[t + h] - y[t]| over the window (used when no model can be trusted)."""
    n, t = hist.shape
    out = np.full((n, steps), np.nan)
    reach = min(steps, t - 1)
    if reach > 0:
        # All lags at once (issue 18): errors (n, origins, lag), NaN where a lag has fewer
        # origins; one conformal call instead of one per lag, same result.
        err = np.full((n, t - 1, reach), np.nan)
        for h in range(1, reach + 1):
            err[:, : t - h, h - 1] = np.abs(hist[:, h:] - hist[:, : t - h])
        out[:, :reach] = conformal_half_width(err, np.full(n, level))
    filled: FloatArray = np.fmax.accumulate(np.where(np.isfinite(out), out, -np.inf), axis=1)
    return np.where(np.isfinite(filled), filled, np.nan)


def peak_offset(peak_errors: FloatArray) -> FloatArray:
    """Per row (n,): PEAK_QUANTILE of the recent peak errors (n, origins), interpolated
    between order statistics, ignoring NaN; 0 for a row with none."""
    ordered = np.sort(peak_errors, axis=1)  # NaN sorts last
    depth = peak_errors.shape[1]
    if depth and (np.isfinite(ordered[:, 0]) & np.isfinite(ordered[:, -1])).all():
        # every error finite (the steady state): one count for all, the same figures once
        pos = PEAK_QUANTILE * (depth - 1)
        at = math.floor(pos)
        part = pos - at
        every: FloatArray = ordered[:, at] * (1 - part) + ordered[:, min(at + 1, depth - 1)] * part
        return every
    count = np.isfinite(peak_errors).sum(axis=1)
    pos = PEAK_QUANTILE * np.maximum(count - 1, 0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(count - 1, 0))
    rows = np.arange(peak_errors.shape[0])
    frac = pos - lo
    value = ordered[rows, lo] * (1 - frac) + ordered[rows, hi] * frac
    out: FloatArray = np.where(count > 0, value, 0.0)
    return out
