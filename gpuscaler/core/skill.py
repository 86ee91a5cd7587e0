"""Has a workload's forecast earned its floor? A counterfactual on the observed series.

At each past tick (an origin o) three capacities are compared against what came:
- reactive R_o: what a reactive scaler on the same signal sizes for, the highest value
  seen in the stabilization window before o (the HPA holds its highest recommendation
  of that window while scaling down);
- predictive P_o = max(R_o, forecast upper bound over the lead time at o): the floor;
- need Y_o: the highest value observed in (o, o + lead].
Shortfalls are max(0, Y - capacity). The floor's extra capacity, sum(P - R), is then
spread evenly instead (flat headroom u per origin, the same cost). Skill is the shortfall
the forecast avoided beyond what flat headroom avoids, as a share of the reactive
shortfall: (short(R + u) - short(P)) / short(R). Zero means the forecast placed its
extra capacity no better than a lower target would have; no reactive shortfall at all
means nothing to gain (skill 0).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from gpuscaler.core.model import TargetHistory


@dataclass(frozen=True)
class Skill:
    score: float | None
    """None until enough origins are scored."""
    origins: int


def remember(
    h: TargetHistory, now: float, value: float, upper: float, keep: float
) -> TargetHistory:
    """History with this tick's observation and forecast added, older than `keep` gone."""
    seen = (*tuple(r for r in h.seen if r[0] > now - keep), (now, value, upper))
    return replace(h, seen=seen)


def assess(
    h: TargetHistory, now: float, lead: float, stabilization: float, min_origins: int
) -> Skill:
    if len(h.seen) < 2:
        return Skill(None, 0)
    rec = np.asarray(h.seen, dtype=np.float64)
    t, v, up = rec[:, 0], rec[:, 1], rec[:, 2]
    scored = t + lead <= now
    if not scored.any():
        return Skill(None, 0)
    o = t[scored][:, None]
    before = (t[None, :] >= o - stabilization) & (t[None, :] <= o)
    after = (t[None, :] > o) & (t[None, :] <= o + lead)
    has_after = after.any(axis=1)
    reactive = np.where(before, v[None, :], -np.inf).max(axis=1)[has_after]
    need = np.where(after, v[None, :], -np.inf).max(axis=1)[has_after]
    n = int(reactive.size)
    if n < min_origins:
        return Skill(None, n)
    predictive = np.maximum(reactive, up[scored][has_after])
    flat = reactive + float(np.mean(predictive - reactive))
    short_r = float(np.maximum(0.0, need - reactive).sum())
    if short_r <= 1e-9:
        return Skill(0.0, n)
    short_p = float(np.maximum(0.0, need - predictive).sum())
    short_flat = float(np.maximum(0.0, need - flat).sum())
    return Skill((short_flat - short_p) / short_r, n)


def in_fallback(h: TargetHistory, skill: Skill, below: float, above: float) -> bool:
    """Whether the floor steps back to reactive: skill under `below` engages, over
    `above` returns (hysteresis); no verdict keeps the current state."""
    if skill.score is None:
        return h.fallback
    if h.fallback:
        return skill.score < above
    return skill.score < below
