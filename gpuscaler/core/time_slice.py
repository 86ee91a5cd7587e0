"""Time slice level of a node pool (nvidia-smi compute-policy levels, which have no
published durations).

Stall (engine busy while SMs idle) above `stall_above_pct` over the stall window means
tenants thrash each other's caches: step the slice longer. Once stall has stayed below
`recover_below_pct` for the stabilization period, step back toward the pool's base level.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Final

from gpuscaler.config import TIME_SLICE_LEVELS, NodePoolConfig, TimeSliceConfig
from gpuscaler.core.decisions import TimeSliceDecision
from gpuscaler.core.guards import Outcome, cooling_down, hold, invalid
from gpuscaler.core.model import PoolObservation, TargetHistory

KIND: Final = "time_slice"


def base_level(pool: NodePoolConfig, cfg: TimeSliceConfig) -> str:
    return cfg.compute_bound_level if pool.profile == "compute_bound" else cfg.io_bound_level


def _checked(
    obs: PoolObservation, cfg: TimeSliceConfig, staleness: float, h: TargetHistory, now: float
) -> tuple[float, str] | Outcome:
    """The stall mean and the level the pool runs now, or why they cannot be acted on."""
    stall = obs.stall_mean_pct
    if stall is None or not math.isfinite(stall):
        why = obs.utilization.problem or (  # the pool's problem, if it has one
            f"stall: no sample in the last {cfg.stall_window:.0f}s (stale or missing)"
            if stall is None
            else "stall mean not finite"
        )
        return invalid(KIND, obs.name, now, why, h)
    if obs.stall_last_sample_time is None or now - obs.stall_last_sample_time > staleness:
        return invalid(KIND, obs.name, now, "stall series stale or empty", h)
    current = obs.time_slice_level or "default"
    if current not in TIME_SLICE_LEVELS:
        return invalid(KIND, obs.name, now, f"unknown time slice level {current!r}", h)
    return stall, current


def decide_time_slice(
    obs: PoolObservation,
    pool: NodePoolConfig,
    cfg: TimeSliceConfig,
    staleness: float,
    h: TargetHistory,
    now: float,
) -> Outcome:
    target = obs.name
    checked = _checked(obs, cfg, staleness, h, now)
    if isinstance(checked, Outcome):
        return checked
    stall, current = checked
    base = base_level(pool, cfg)
    if stall > cfg.stall_above_pct:
        h = replace(h, calm_since=None)
        rank = TIME_SLICE_LEVELS.index(current)
        if rank == len(TIME_SLICE_LEVELS) - 1:
            return hold(KIND, target, now, f"at bound: stall {stall:.1f}%, slice already long", h)
        to = TIME_SLICE_LEVELS[min(len(TIME_SLICE_LEVELS) - 1, rank + cfg.max_step)]
        why = f"stall mean over {cfg.stall_window:.0f}s {stall:.1f}% > {cfg.stall_above_pct:g}%"
    elif stall < cfg.recover_below_pct and current != base:
        calm = h.calm_since if h.calm_since is not None else now
        h = replace(h, calm_since=calm)
        if now - calm < cfg.stabilization:
            why = f"stall {stall:.1f}% low for {now - calm:.0f}s of {cfg.stabilization:.0f}s"
            return hold(KIND, target, now, f"wait: {why} before returning toward {base}", h)
        rank = TIME_SLICE_LEVELS.index(current)
        step = 1 if TIME_SLICE_LEVELS.index(base) > rank else -1
        to = TIME_SLICE_LEVELS[rank + step]
        why = (
            f"stall mean over {cfg.stall_window:.0f}s {stall:.1f}% < "
            f"{cfg.recover_below_pct:g}% for {now - calm:.0f}s, back toward base {base}"
        )
    else:
        if stall >= cfg.recover_below_pct:
            h = replace(h, calm_since=None)
        return hold(KIND, target, now, f"hold: stall {stall:.1f}% at level {current}", h)
    left = cooling_down(h, now, cfg.cooldown)
    if left > 0:
        return hold(KIND, target, now, f"cooldown: {why}, {left:.0f}s left", h)
    decision = TimeSliceDecision(
        time=now,
        target=target,
        from_value=current,
        to_value=to,
        reason=f"{why}; level {current} -> {to}",
        forecast={"stall_mean": stall},
    )
    return Outcome(replace(h, calm_since=None), decision=decision)
