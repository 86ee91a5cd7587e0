"""The replica floor's skill assessment and overflow reserve as they were before they
were made cheaper per tick (commit 3b3a100): the oracle of tests/test_floor_equivalence.py.
Each call converted the records to an array and compared every origin with every record;
the bisection evaluated every step on the arrays."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpuscaler.core.model import FloatArray, Forecast, TargetHistory
from gpuscaler.core.reserve import Reserve
from gpuscaler.core.skill import Skill

Seen = tuple[tuple[float, float, float, float], ...]


def remember(
    h: TargetHistory, now: float, value: float, upper: float, mean: float, keep: float
) -> TargetHistory:
    seen = (*tuple(r for r in h.seen if r[0] > now - keep), (now, value, upper, mean))
    return replace(h, seen=seen)


def _shortfall(need: FloatArray, capacity: FloatArray) -> float:
    return float(np.maximum(0.0, need - capacity).sum())


def at_cost(reactive: FloatArray, base: FloatArray, extra: float) -> FloatArray:
    lo, hi = -float(np.max(base - reactive)) - 1.0, float(extra) + 1.0
    total = reactive.sum()
    for _ in range(40):
        c = (lo + hi) / 2
        if float(np.maximum(reactive, base + c).sum() - total) > extra:
            hi = c
        else:
            lo = c
    return np.maximum(reactive, base + lo)


def assess(
    seen: Seen, now: float, lead: float, stabilization: float, min_origins: int, span: float
) -> Skill:
    if len(seen) < 2:
        return Skill(None, 0)
    rec = np.asarray(seen, dtype=np.float64)
    t, v = rec[:, 0], rec[:, 1]
    scored = np.flatnonzero((t + lead <= now) & (t > now - span) & np.isfinite(rec[:, 2]))
    o = t[scored][:, None]
    before = (t[None, :] >= o - stabilization) & (t[None, :] <= o)
    after = (t[None, :] > o) & (t[None, :] <= o + lead)
    ok = after.any(axis=1)
    n = int(ok.sum())
    if n < min_origins:
        return Skill(None, n)
    reactive = np.where(before, v[None, :], -np.inf).max(axis=1)[ok]
    need = np.where(after, v[None, :], -np.inf).max(axis=1)[ok]
    level = (np.where(before, v[None, :], 0.0).sum(axis=1) / before.sum(axis=1))[ok]
    upper, mean = rec[scored, 2][ok], rec[scored, 3][ok]
    predictive = np.maximum(reactive, upper)
    short_r = _shortfall(need, reactive)
    if short_r <= 1e-9:
        return Skill(0.0, n)
    extra = float((predictive - reactive).sum())
    flat = reactive + extra / n
    levelled = at_cost(reactive, level + (upper - mean), extra)
    best_other = min(_shortfall(need, flat), _shortfall(need, levelled))
    return Skill((best_other - _shortfall(need, predictive)) / short_r, n)


def overflow_reserve(
    seen: Seen, now: float, window: float, span: float, at_target: float, full: float
) -> Reserve | None:
    if not seen:
        return None
    rec = np.asarray(seen, dtype=np.float64)
    t, v = rec[:, 0], rec[:, 1]
    ok = np.isfinite(v)
    scored = np.flatnonzero((t > now - span) & ok)
    before = (t[None, :] >= t[scored, None] - window) & (t[None, :] < t[scored, None]) & ok
    has = before.any(axis=1)
    scored, before = scored[has], before[has]
    if not scored.size:
        return None
    reactive = np.where(before, v[None, :], -np.inf).max(axis=1)
    replicas = np.maximum(1.0, np.ceil(reactive / at_target - 1e-9))
    over = v[scored] > replicas * full + 1e-9
    if not over.any():
        return None
    hit = scored[over]
    top = hit[len(hit) - 1 - int(np.argmax(v[hit][::-1]))]
    return Reserve(float(v[top]), now - float(t[top]), int(over.sum()))


def observed_peak(h: TargetHistory, now: float, window: float) -> float:
    return max(v for t, v, _, _ in h.seen if t > now - window or t == now)


def forecast_figures(f: Forecast, lead: float) -> tuple[bool, float, float, float]:
    """What `replicas.floor_step` took of a forecast one workload at a time before the
    figures were taken over rows (commit 79c90bb): finiteness, the highest upper bound
    and mean over the lead time, the path's peak."""
    mean_peak = float(np.max(f.mean[: max(1, round(lead / f.step))]))
    return f.is_finite(), f.peak_upper_within(lead), mean_peak, f.peak
