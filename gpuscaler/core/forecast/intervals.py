"""Prediction intervals and the peak. Split-conformal: with n recent absolute errors at a
step, the half width at level L is the ceil((n + 1) L)-th smallest (the largest past n).
Adaptive conformal inference (Gibbs & Candes 2021): each tick the points observed since
the last are checked against the intervals issued before, and the series' level moves by
ACI_GAMMA x (miss rate - (1 - nominal)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpuscaler.core.model import BoolArray, FloatArray, IntArray

MIN_RESIDUALS = 8
"""Fewer recent errors than this at a step: no conformal interval from them."""
PEAK_QUANTILE = 0.5
"""The peak adds this quantile of the recent peak errors (the median: least absolute
error of the peak)."""
ACI_GAMMA = 0.1
"""Step of the adaptive level per tick: large, as a series may have only a few hundred
ticks (a smaller one left coverage off nominal in bench/forecast_quality.py)."""
ACI_LEVELS = (0.05, 0.995)
"""The adaptive level stays inside these bounds."""
EPS = 1e-9


def conformal_half_width(abs_errors: FloatArray, level: FloatArray) -> FloatArray:
    """Half width (n, steps) from absolute errors (n, steps, origins) at each row's
    `level` (n,); NaN at a step with fewer than MIN_RESIDUALS finite errors."""
    ordered = np.sort(abs_errors, axis=2)  # NaN last
    count = np.isfinite(abs_errors).sum(axis=2)  # (n, steps)
    rank = np.ceil((count + 1) * level[:, None]).astype(np.int64)
    idx = np.maximum(np.minimum(rank, count) - 1, 0)
    out = np.take_along_axis(ordered, idx[:, :, None], axis=2)[:, :, 0]
    result: FloatArray = np.where(count >= MIN_RESIDUALS, out, np.nan)
    return result


def naive_half_width(hist: FloatArray, steps: int, level: float) -> FloatArray:
    """Half width (n, steps) of the last value's interval, for when no model can be trusted:
    the conformal quantile of |y[t + h] - y[t]| over the window, never narrower later."""
    n, t = hist.shape
    out = np.full((n, steps), np.nan)
    reach = min(steps, t - 1)
    if reach > 0:
        errors = np.full((n, reach, t - 1), np.nan)
        for h in range(1, reach + 1):
            errors[:, h - 1, : t - h] = np.abs(hist[:, h:] - hist[:, : t - h])
        out[:, :reach] = conformal_half_width(errors, np.full(n, level))
    filled: FloatArray = np.fmax.accumulate(np.where(np.isfinite(out), out, -np.inf), axis=1)
    return np.where(np.isfinite(filled), filled, np.nan)


def peak_offset(peak_errors: FloatArray) -> FloatArray:
    """Per row (n,): PEAK_QUANTILE of the recent peak errors (n, origins), ignoring NaN;
    0 for a row with none."""
    finite: BoolArray = np.asarray(np.isfinite(peak_errors).any(axis=1))
    safe = np.where(finite[:, None], peak_errors, 0.0)
    with np.errstate(invalid="ignore"):
        out: FloatArray = np.where(finite, _nanquantile(safe, PEAK_QUANTILE), 0.0)
    return out


def _nanquantile(a: FloatArray, q: float) -> FloatArray:
    """`np.nanquantile(a, q, axis=1)` for rows with at least one finite value."""
    ordered = np.sort(a, axis=1)
    count = np.isfinite(a).sum(axis=1)
    pos = q * np.maximum(count - 1, 0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(count - 1, 0))
    rows = np.arange(a.shape[0])
    frac = pos - lo
    out: FloatArray = ordered[rows, lo] * (1 - frac) + ordered[rows, hi] * frac
    return out


@dataclass(frozen=True, eq=False)
class Adaptive:
    """Rows' adaptive level, points checked and missed, when last checked, and the
    intervals issued and not yet observed in a ring of `slots` (issued_at NaN: empty, its
    bounds not read)."""

    level: FloatArray  # (n,)
    points: IntArray  # (n,)
    misses: IntArray  # (n,)
    checked_at: FloatArray  # (n,), NaN: never
    issued_at: FloatArray  # (n, slots)
    bounds: FloatArray  # (n, slots, 2, steps): lower, upper of the buckets after issued_at


def fresh(n: int, slots: int, steps: int, nominal: float) -> Adaptive:
    """Rows with nothing issued yet, at the nominal level."""
    return Adaptive(
        np.full(n, nominal),
        np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        np.full(n, np.nan),
        np.full((n, slots), np.nan),
        np.full((n, slots, 2, steps), np.nan),
    )


def check(a: Adaptive, hist: FloatArray, now: float, step: float, nominal: float) -> Adaptive:
    """Every bucket of `hist` (n, t; ending at `now`) observed since each row's last check
    against the intervals issued before that cover it; the levels moved by what missed,
    the intervals fully observed dropped (their slots emptied)."""
    n, _, _, steps = a.bounds.shape
    t = hist.shape[1]
    with np.errstate(invalid="ignore"):
        since = np.where(np.isfinite(a.checked_at), np.round((now - a.checked_at) / step), 0)
    new = np.clip(since, 0, min(t, steps + 1)).astype(np.int64)  # buckets new to each row
    depth = int(new.max()) if n else 0
    j = np.arange(depth)
    ends = now - step * j  # (depth,) the newest buckets' ends, newest first
    y = hist[:, t - 1 - j] if depth else np.empty((n, 0))  # (n, depth)
    with np.errstate(invalid="ignore"):
        k = np.round((ends[None, None, :] - a.issued_at[:, :, None]) / step).astype(np.int64)
    covered = (k >= 1) & (k <= steps) & (j[None, None, :] < new[:, None, None])
    at = np.clip(k - 1, 0, steps - 1)  # (n, slots, depth)
    rows, slots = np.arange(n)[:, None, None], np.arange(a.issued_at.shape[1])[None, :, None]
    lo, hi = a.bounds[rows, slots, 0, at], a.bounds[rows, slots, 1, at]
    seen = covered & np.isfinite(y)[:, None, :]
    with np.errstate(invalid="ignore"):
        missed = seen & ((y[:, None, :] < lo) | (y[:, None, :] > hi))
    seen_n, missed_n = seen.sum(axis=(1, 2)), missed.sum(axis=(1, 2))
    low, high = ACI_LEVELS
    with np.errstate(invalid="ignore", divide="ignore"):
        moved = np.clip(a.level + ACI_GAMMA * (missed_n / seen_n - (1.0 - nominal)), low, high)
        done = ~(a.issued_at + step * steps > now + EPS)  # NaN slots stay empty
    return Adaptive(
        np.where(seen_n > 0, moved, a.level),
        a.points + seen_n,
        a.misses + missed_n,
        np.full(n, now),
        np.where(done, np.nan, a.issued_at),
        a.bounds,  # read only where issued: an emptied slot's are left for the next issue
    )


def issue(a: Adaptive, now: float, lower: FloatArray, upper: FloatArray) -> Adaptive:
    """The intervals issued `now` (lower, upper (n, steps)) put in each row's ring: in an
    empty slot, else in place of the oldest."""
    n = a.issued_at.shape[0]
    slot = np.argmin(np.where(np.isfinite(a.issued_at), a.issued_at, -np.inf), axis=1)
    rows = np.arange(n)
    issued_at, bounds = a.issued_at.copy(), a.bounds.copy()
    issued_at[rows, slot] = now
    bounds[rows, slot, 0], bounds[rows, slot, 1] = lower, upper
    return Adaptive(a.level, a.points, a.misses, a.checked_at, issued_at, bounds)


def coverage_text(nominal: float, level: float, points: int, misses: int) -> str:
    """How a row's adaptive level stands, for its forecast's reason."""
    if not points or not math.isfinite(level):
        return f"interval level {nominal:g}"
    return (
        f"interval at conformal level {level:.2f} (nominal {nominal:g}, "
        f"{1 - misses / points:.2f} covered of {points} points so far)"
    )
