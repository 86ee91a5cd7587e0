"""Fragments per GPU of a node pool (time-slicing or MPS replicas).

Forecast peak above `fewer_above_pct`: halve (each task gets more GPU). Forecast upper
bound below `more_below_pct`: double (more concurrency). Always within the allowed counts,
the memory floor per fragment after the reserve and the over-commit allowance, and with
compute never over-committed after the change.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Final

from gpuscaler.config import FragmentsConfig, NodePoolConfig
from gpuscaler.core.guards import (
    Outcome,
    cooling_down,
    held_for,
    hold,
    input_problem,
    invalid,
    sustain,
)
from gpuscaler.core.model import Decision, PoolObservation, TargetHistory

KIND: Final = "fragments"


def memory_limit(gpu_memory_gib: float, floor_gib: float, cfg: FragmentsConfig) -> int:
    """Most fragments a GPU can hold: usable memory (after the reserve) times the
    over-commit allowance, divided by the per-fragment floor."""
    usable = gpu_memory_gib * (1 - cfg.memory_reserve_ratio)
    return math.floor(usable * cfg.max_memory_overcommit / floor_gib + 1e-9)


def decide_fragments(
    obs: PoolObservation,
    pool: NodePoolConfig,
    cfg: FragmentsConfig,
    staleness: float,
    h: TargetHistory,
    now: float,
) -> Outcome:
    target = obs.name
    problem = input_problem(obs.utilization, now, staleness)
    if problem is not None:
        return invalid(KIND, target, now, problem, h)
    if obs.fragments is None:
        return invalid(KIND, target, now, "current fragments unknown", h)
    current = obs.fragments
    if current not in cfg.allowed:
        return invalid(
            KIND, target, now, f"current fragments {current} not in allowed {cfg.allowed}", h
        )
    forecast = obs.utilization.forecast
    assert forecast is not None
    peak, upper = forecast.peak, forecast.peak_upper

    # Trigger, with a margin when it would reverse the previous change (hysteresis).
    fewer_at = cfg.fewer_above_pct + (cfg.reversal_margin_pct if h.last_direction > 0 else 0)
    more_at = cfg.more_below_pct - (cfg.reversal_margin_pct if h.last_direction < 0 else 0)
    if peak > fewer_at:
        direction, why = -1, f"forecast peak {peak:.1f}% > {fewer_at:g}%"
    elif upper < more_at:
        direction, why = +1, f"forecast upper bound {upper:.1f}% < {more_at:g}%"
    else:
        return hold(
            KIND,
            target,
            now,
            f"hold: forecast peak {peak:.1f}%, upper {upper:.1f}% within "
            f"[{more_at:g}%, {fewer_at:g}%]",
            sustain(h, 0, now),
        )
    h = sustain(h, direction, now)
    if held_for(h, now) < cfg.sustain:
        return hold(
            KIND,
            target,
            now,
            f"wait: {why} for {held_for(h, now):.0f}s of the {cfg.sustain:.0f}s it must hold",
            h,
        )
    left = cooling_down(h, now, cfg.cooldown)
    if left > 0:
        return hold(KIND, target, now, f"cooldown: {why}, {left:.0f}s of cooldown left", h)

    floor_gib = cfg.min_fragment_memory_gib[pool.workload_type]
    gpu_gib = obs.gpu_memory_gib or pool.gpu_memory_gib
    mem_max = memory_limit(gpu_gib, floor_gib, cfg)
    if direction < 0:
        want = max(1, current >> cfg.max_step)
        candidates = [f for f in cfg.allowed if want <= f < current]
        if not candidates:
            return hold(KIND, target, now, f"at bound: {why}, already at fewest allowed", h)
        to = candidates[0]
        if to < obs.max_shares_held:
            held = hold(
                KIND,
                target,
                now,
                f"blocked: {why}, but pods hold {obs.max_shares_held} shares of one GPU; "
                f"{to} fragments needs preemption first",
                h,
            )
            return replace(held, blocked_until_preempted=to)
        bound = f"fewest allowed {cfg.allowed[0]}" if to == cfg.allowed[0] else "max step"
    else:
        g = obs.gpus_held
        step = next((f for f in cfg.allowed if f > current), None)
        after = None if g is None or step is None else math.ceil(g * current / step)
        if g is not None and after is not None and (after >= g or upper * g > more_at * after):
            # The same replicas packed `step` to a GPU hold `after` GPUs: the pool's demand
            # in GPUs (per-GPU demand x GPUs held) must still fit them below the "more"
            # threshold, or the change takes away capacity the replicas need (the
            # autoscaler then adds replicas back: no GPU saved, only overhead).
            return hold(
                KIND,
                target,
                now,
                f"hold: {why}, but demand {upper * g / 100:.2f} GPUs would not fit the "
                f"{after} GPUs {step} fragments leave at {more_at:g}%: more fragments "
                "would pack nothing",
                h,
            )
        want = current << cfg.max_step
        # Compute never over-committed: per-GPU demand scales with tenants per GPU.
        compute_max = (cfg.max_compute_commit * 100) * current / max(upper, 1e-9)
        candidates = [
            f for f in cfg.allowed if current < f <= min(want, mem_max) and f <= compute_max
        ]
        to = candidates[-1] if candidates else current
        nxt = next((f for f in cfg.allowed if f > to), None)  # the count a bound refused
        if nxt is None:
            limit = "most allowed"
        elif nxt > mem_max:
            per = gpu_gib * (1 - cfg.memory_reserve_ratio) * cfg.max_memory_overcommit / nxt
            limit = (
                f"memory bound: {nxt} fragments would leave {per:.1f} GiB each, "
                f"below the {floor_gib:g} GiB {pool.workload_type} floor"
            )
        elif nxt > compute_max:
            limit = (
                f"compute bound: {nxt} fragments would put projected demand at "
                f"{upper * nxt / current:.0f}% of a GPU"
            )
        else:
            limit = "max step"
        if candidates and obs.memory_used_gib is not None:
            # Tenants already use this much each; a smaller share would not hold them.
            per_tenant = obs.memory_used_gib / current
            usable = gpu_gib * (1 - cfg.memory_reserve_ratio) * cfg.max_memory_overcommit
            fitting = [f for f in candidates if usable / f >= per_tenant]
            if len(fitting) < len(candidates):
                refused = candidates[len(fitting)]
                limit = (
                    f"memory in use: tenants hold {per_tenant:.1f} GiB each, {refused} "
                    f"fragments would leave {usable / refused:.1f} GiB"
                )
                candidates = fitting
        if not candidates:
            return hold(KIND, target, now, f"at bound: {why}, {limit}", h)
        to, bound = candidates[-1], limit
    decision = Decision(
        time=now,
        kind=KIND,
        target=target,
        from_value=current,
        to_value=to,
        reason=f"{why} held {held_for(h, now):.0f}s; {current} -> {to} fragments ({bound}); "
        f"{forecast.reason}",
        forecast={"peak": peak, "upper": upper, "last": forecast.last_value},
    )
    return Outcome(h, decision=decision)
