"""Prediction intervals and the peak: split-conformal from the recent absolute errors at
each step, an adaptive correction carried across ticks per series, and the peak's offset.

Conformal: with n recent absolute errors at a step, the half width at level L is the
ceil((n + 1) L)-th smallest (the small-sample rank correction; the largest when that
rank exceeds n). Adaptive conformal inference (Gibbs & Candes 2021, "Adaptive conformal
inference under distribution shift"): each tick, the points observed since the last one
are checked against the intervals issued before; the level moves by ACI_GAMMA times
(miss rate - (1 - nominal)), so a series whose intervals miss too often gets wider ones.
"""

from __future__ import annotations

import math
from itertools import chain
from operator import attrgetter

import numpy as np

from gpuscaler.core.model import FloatArray, IntervalState, IssuedInterval

MIN_RESIDUALS = 8
"""Fewer recent errors than this at a step: no conformal interval from them."""
ACI_GAMMA = 0.1
"""Step of the adaptive level per tick. Each tick's miss rate pools the points of up to a
horizon's worth of issued intervals, and a series may have only a few hundred ticks (1 h
at 10 s): 0.02 and 0.05 left the 2023 traces' coverage 0.04-0.06 off nominal, 0.1 within
0.03 (bench/forecast_quality.py; Gibbs & Candes use 0.005 on far longer sequences)."""
ACI_LEVELS = (0.05, 0.995)
"""The adaptive level stays inside these bounds."""
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
    count = np.isfinite(ordered).sum(axis=1)  # (n, steps)
    rank = np.ceil((count + 1) * level[:, None]).astype(np.int64)
    idx = np.clip(np.minimum(rank, count) - 1, 0, None)
    out: FloatArray = np.take_along_axis(ordered, idx[:, None, :], axis=1)[:, 0, :]
    return np.where(count >= MIN_RESIDUALS, out, np.nan)


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
    count = np.isfinite(peak_errors).sum(axis=1)
    pos = PEAK_QUANTILE * np.maximum(count - 1, 0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(count - 1, 0))
    rows = np.arange(peak_errors.shape[0])
    frac = pos - lo
    value = ordered[rows, lo] * (1 - frac) + ordered[rows, hi] * frac
    out: FloatArray = np.where(count > 0, value, 0.0)
    return out


def resolve(
    state: IntervalState | None, row: FloatArray, now: float, step: float, nominal: float
) -> IntervalState:
    """The adaptive state after checking every point observed since `state.checked_at`
    against the intervals issued before; `row` is the bucketed window ending at `now`.
    The result's `checked_at` is `now`; its pending intervals are those not yet fully
    observed. The pending intervals of one length are checked at once (one array each),
    not one by one: a tick holds about a horizon's worth of them per series."""
    if state is None:
        return IntervalState(level=nominal, checked_at=now)
    points = misses = 0
    keep: tuple[IssuedInterval, ...] = ()
    if state.pending:
        points, misses, keep = _check_pending(state, row, now, step)
    level = state.level
    if points:
        level += ACI_GAMMA * (misses / points - (1.0 - nominal))
        level = min(max(level, ACI_LEVELS[0]), ACI_LEVELS[1])
    return IntervalState(level, now, keep, state.points + points, state.misses + misses)


_LOWER, _UPPER = attrgetter("lower"), attrgetter("upper")
_ORIGIN, _STEP = attrgetter("origin"), attrgetter("step")


def _check_pending(
    state: IntervalState, row: FloatArray, now: float, step: float
) -> tuple[int, int, tuple[IssuedInterval, ...]]:
    """(points observed since `state.checked_at`, of which outside their interval, the
    intervals still pending): every pending interval's buckets checked in one pass
    (issue 18; one interval at a time cost about 0.5 ms per series and tick)."""
    pending = state.pending
    n = len(pending)
    sizes = np.fromiter(map(len, map(_LOWER, pending)), np.int64, n)
    total = int(sizes.sum())
    origin = np.repeat(np.fromiter(map(_ORIGIN, pending), np.float64, n), sizes)
    spacing = np.repeat(np.fromiter(map(_STEP, pending), np.float64, n), sizes)
    # 1, 2, ..., size within each interval: the bucket ends origin + step * k
    k = np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes) + 1
    taus = origin + spacing * k.astype(np.float64)
    lower = np.fromiter(chain.from_iterable(map(_LOWER, pending)), np.float64, total)
    upper = np.fromiter(chain.from_iterable(map(_UPPER, pending)), np.float64, total)
    new = (taus > state.checked_at + 1e-9) & (taus <= now + 1e-9)
    idx = len(row) - 1 - np.round((now - taus[new]) / step).astype(np.int64)
    inside = idx >= 0
    y = row[idx[inside]]
    lo, hi = lower[new][inside], upper[new][inside]
    seen = np.isfinite(y)
    # an interval's last bucket ends at origin + step * size; an empty one has none
    ends = [p.origin + p.step * float(len(p.lower)) if p.lower else -math.inf for p in pending]
    keep = tuple(p for p, t in zip(pending, ends, strict=True) if t > now + 1e-9)
    return int(seen.sum()), int(((y < lo) | (y > hi))[seen].sum()), keep


def issue(state: IntervalState, lower: FloatArray, upper: FloatArray, step: float) -> IntervalState:
    """`state` with the interval issued now (at `state.checked_at`) pending."""
    issued = IssuedInterval(state.checked_at, step, tuple(lower.tolist()), tuple(upper.tolist()))
    return IntervalState(
        state.level, state.checked_at, (*state.pending, issued), state.points, state.misses
    )


def coverage_note(state: IntervalState | None, nominal: float) -> str:
    """How the adaptive level stands, for the forecast's reason."""
    if state is None or not state.points:
        return f"interval level {nominal:g}"
    seen = 1 - state.misses / state.points
    level = state.level
    return (
        f"interval at conformal level {level:.2f} (nominal {nominal:g}, "
        f"{seen:.2f} covered of {state.points} points so far)"
        if math.isfinite(level)
        else f"interval level {nominal:g}"
    )


def reissue(state: IntervalState, lower: FloatArray, upper: FloatArray) -> IntervalState:
    """`state` with the interval issued now (the last pending one, issued at
    `state.checked_at`) replaced by the one finally used: the adaptive level tracks the
    interval that reached the decision."""
    pending = state.pending
    if not pending or abs(pending[-1].origin - state.checked_at) > 1e-9:
        return state
    last = pending[-1]
    issued = IssuedInterval(last.origin, last.step, tuple(lower.tolist()), tuple(upper.tolist()))
    return IntervalState(
        state.level, state.checked_at, (*pending[:-1], issued), state.points, state.misses
    )
