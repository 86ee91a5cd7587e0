"""Has a workload's forecast earned its floor? A counterfactual on the observed series.

At each past tick (an origin o) capacities are compared against what came:
- reactive R_o: what a reactive scaler on the same signal sizes for, the highest value
  seen in the stabilization window before o (the HPA holds its highest recommendation
  of that window while scaling down);
- predictive P_o = max(R_o, forecast upper bound over the lead time at o): the floor;
- need Y_o: the highest value observed in (o, o + lead].
Shortfalls are max(0, Y - capacity). The floor's extra capacity, sum(P - R), is then
placed two cheaper ways at the same total: spread evenly (flat headroom, what a lower
target buys), and as a level floor (the recent mean plus the forecast's own band, shifted
to the same cost: what knowing the level without foresight buys). Skill is the shortfall
the forecast avoided beyond the better of the two, as a share of the reactive shortfall.
Zero: the forecast's extra capacity did no better than a lower target or a level would
have; no reactive shortfall at all means nothing to gain (skill 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from gpuscaler.core.model import FloatArray, TargetHistory


@dataclass(frozen=True)
class Skill:
    score: float | None
    """None until enough origins are scored."""
    origins: int


def remember(
    h: TargetHistory, now: float, value: float, upper: float, mean: float, keep: float
) -> TargetHistory:
    """History with this tick's observation and forecast (upper bound and mean peak over
    the lead time) added, records older than `keep` gone."""
    seen = (*tuple(r for r in h.seen if r[0] > now - keep), (now, value, upper, mean))
    return replace(h, seen=seen)


def _shortfall(need: FloatArray, capacity: FloatArray) -> float:
    return float(np.maximum(0.0, need - capacity).sum())


def _at_cost(reactive: FloatArray, base: FloatArray, extra: float) -> FloatArray:
    """max(reactive, base + c) with c chosen (bisection) so its extra over `reactive`
    sums to `extra`."""
    lo, hi = -float(np.max(base - reactive)) - 1.0, float(extra) + 1.0
    total = reactive.sum()  # the same every step: summed once
    for _ in range(40):
        c = (lo + hi) / 2
        if float(np.maximum(reactive, base + c).sum() - total) > extra:
            hi = c
        else:
            lo = c
    return np.maximum(reactive, base + lo)


def assess(
    h: TargetHistory,
    now: float,
    lead: float,
    stabilization: float,
    min_origins: int,
    span: float = math.inf,
) -> Skill:
    """The forecast's skill over the origins of the last `span` seconds of `h.seen`."""
    if len(h.seen) < 2:
        return Skill(None, 0)
    rec = np.asarray(h.seen, dtype=np.float64)
    t, v = rec[:, 0], rec[:, 1]
    # Ticks without a forecast (NaN bound: too little history) are observed, not scored.
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
    levelled = _at_cost(reactive, level + (upper - mean), extra)
    best_other = min(_shortfall(need, flat), _shortfall(need, levelled))
    return Skill((best_other - _shortfall(need, predictive)) / short_r, n)


def in_fallback(h: TargetHistory, skill: Skill, below: float, above: float) -> bool:
    """Whether the floor steps back to reactive: skill under `below` engages, over
    `above` returns (hysteresis). Until enough origins are scored the forecast has
    proven nothing: reactive."""
    if skill.score is None:
        return True
    if h.fallback:
        return skill.score < above
    return skill.score < below
