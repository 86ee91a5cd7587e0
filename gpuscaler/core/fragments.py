"""Fragments per GPU of a node pool (time-slicing or MPS replicas).

Forecast peak above `fewer_above_pct`: halve (each task gets more GPU). Forecast upper
bound below `more_below_pct`: double (more concurrency). Always within the allowed counts,
the memory floor per fragment after the reserve and the over-commit allowance, and with
compute never over-committed after the change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Final

from gpuscaler.config import FragmentsConfig, NodePoolConfig
from gpuscaler.core.decisions import FragmentsDecision
from gpuscaler.core.guards import (
    Outcome,
    cooling_down,
    held_for,
    hold,
    input_problem,
    invalid,
    sustain,
)
from gpuscaler.core.model import PoolObservation, TargetHistory

KIND: Final = "fragments"


def memory_limit(gpu_memory_gib: float, floor_gib: float, cfg: FragmentsConfig) -> int:
    """Most fragments a GPU can hold: usable memory (after the reserve) times the
    over-commit allowance, divided by the per-fragment floor."""
    usable = gpu_memory_gib * (1 - cfg.memory_reserve_ratio)
    return math.floor(usable * cfg.max_memory_overcommit / floor_gib + 1e-9)


@dataclass(frozen=True)
class _Step:
    """What the trigger asks for: fewer (-1) or more (+1) fragments, and why."""

    direction: int
    why: str
    peak: float
    upper: float
    more_at: float


def decide_fragments(
    obs: PoolObservation,
    pool: NodePoolConfig,
    cfg: FragmentsConfig,
    staleness: float,
    h: TargetHistory,
    now: float,
    floor_gpus: float = 0.0,
) -> Outcome:
    """Trusted input; the forecast out of the band long enough, out of cooldown; the next
    count within every bound (allowed, memory, compute, memory in use, shares held, GPUs
    saved). `floor_gpus`: what the pool's replica floors hold sized for their load."""
    target = obs.name
    current = _current(obs, cfg, staleness, h, now)
    if isinstance(current, Outcome):
        return current
    forecast = obs.utilization.forecast
    assert forecast is not None
    peak, upper = forecast.peak, forecast.peak_upper
    step = _trigger(peak, upper, cfg, h)
    if not isinstance(step, _Step):
        within = f"within [{step[0]:g}%, {step[1]:g}%]"
        why = f"hold: forecast peak {peak:.1f}%, upper {upper:.1f}% {within}"
        return hold(KIND, target, now, why, sustain(h, 0, now))
    h = sustain(h, step.direction, now)
    if held_for(h, now) < cfg.sustain:
        held = f"{held_for(h, now):.0f}s of the {cfg.sustain:.0f}s it must hold"
        return hold(KIND, target, now, f"wait: {step.why} for {held}", h)
    left = cooling_down(h, now, cfg.cooldown)
    if left > 0:
        return hold(KIND, target, now, f"cooldown: {step.why}, {left:.0f}s of cooldown left", h)
    if step.direction < 0:
        chosen = _fewer(obs, current, step.why, cfg, h, now)
    else:
        chosen = _more(obs, pool, current, step, cfg, h, now, floor_gpus)
    if isinstance(chosen, Outcome):
        return chosen
    to, bound = chosen
    decision = FragmentsDecision(
        time=now,
        target=target,
        from_value=current,
        to_value=to,
        reason=f"{step.why} held {held_for(h, now):.0f}s; {current} -> {to} fragments "
        f"({bound}); {forecast.reason}",
        forecast={"peak": step.peak, "upper": step.upper, "last": forecast.last_value},
    )
    return Outcome(h, decision=decision)


def _current(
    obs: PoolObservation, cfg: FragmentsConfig, staleness: float, h: TargetHistory, now: float
) -> int | Outcome:
    """The fragments the pool runs now, or why the input cannot be acted on."""
    problem = input_problem(obs.utilization, now, staleness)
    if problem is not None:
        return invalid(KIND, obs.name, now, problem, h)
    if obs.fragments is None:
        return invalid(KIND, obs.name, now, "current fragments unknown", h)
    if obs.fragments not in cfg.allowed:
        why = f"current fragments {obs.fragments} not in allowed {cfg.allowed}"
        return invalid(KIND, obs.name, now, why, h)
    return obs.fragments


def _trigger(
    peak: float, upper: float, cfg: FragmentsConfig, h: TargetHistory
) -> _Step | tuple[float, float]:
    """Fewer when the forecast peak is above the band, more when its upper bound is below
    it, with a margin when that would reverse the previous change (hysteresis); else the
    band's edges (more below, fewer above)."""
    fewer_at = cfg.fewer_above_pct + (cfg.reversal_margin_pct if h.last_direction > 0 else 0)
    more_at = cfg.more_below_pct - (cfg.reversal_margin_pct if h.last_direction < 0 else 0)
    if peak > fewer_at:
        return _Step(-1, f"forecast peak {peak:.1f}% > {fewer_at:g}%", peak, upper, more_at)
    if upper < more_at:
        return _Step(+1, f"forecast upper bound {upper:.1f}% < {more_at:g}%", peak, upper, more_at)
    return more_at, fewer_at


def _fewer(
    obs: PoolObservation, current: int, why: str, cfg: FragmentsConfig, h: TargetHistory, now: float
) -> tuple[int, str] | Outcome:
    """At most `max_step` halvings, to an allowed count; blocked (for preemption) while
    pods hold more shares of one GPU than that."""
    want = max(1, current >> cfg.max_step)
    candidates = [f for f in cfg.allowed if want <= f < current]
    if not candidates:
        return hold(KIND, obs.name, now, f"at bound: {why}, already at fewest allowed", h)
    to = candidates[0]
    if to < obs.max_shares_held:
        shares = f"pods hold {obs.max_shares_held} shares of one GPU"
        why = f"blocked: {why}, but {shares}; {to} fragments needs preemption first"
        held = hold(KIND, obs.name, now, why, h)
        return replace(held, blocked_until_preempted=to)
    return to, f"fewest allowed {cfg.allowed[0]}" if to == cfg.allowed[0] else "max step"


def _more(
    obs: PoolObservation,
    pool: NodePoolConfig,
    current: int,
    step: _Step,
    cfg: FragmentsConfig,
    h: TargetHistory,
    now: float,
    floor_gpus: float,
) -> tuple[int, str] | Outcome:
    """At most `max_step` doublings, to an allowed count that packs something and stays
    within memory (config floor and what tenants use now) and compute."""
    why, upper = step.why, step.upper
    nothing = _packs_nothing(obs.gpus_held, current, upper, step.more_at, cfg, floor_gpus)
    if nothing is not None:
        return hold(KIND, obs.name, now, f"hold: {why}, but {nothing}", h)
    floor_gib = cfg.min_fragment_memory_gib[pool.workload_type]
    gpu_gib = obs.gpu_memory_gib or pool.gpu_memory_gib
    mem_max = memory_limit(gpu_gib, floor_gib, cfg)
    want = current << cfg.max_step
    # Compute never over-committed: per-GPU demand scales with tenants per GPU.
    compute_max = (cfg.max_compute_commit * 100) * current / max(upper, 1e-9)
    candidates = [f for f in cfg.allowed if current < f <= min(want, mem_max) and f <= compute_max]
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
        candidates, limit = _memory_in_use(
            obs.memory_used_gib, current, gpu_gib, candidates, limit, cfg
        )
    if not candidates:
        return hold(KIND, obs.name, now, f"at bound: {why}, {limit}", h)
    return candidates[-1], limit


def _packs_nothing(
    g: int | None,
    current: int,
    upper: float,
    more_at: float,
    cfg: FragmentsConfig,
    floor_gpus: float = 0.0,
) -> str | None:
    """Why more fragments would pack nothing, or None. The pool's demand must still fit the
    fewer GPUs below the "more" threshold, or the autoscaler adds replicas back (no GPU
    saved, only a device-plugin restart); nor may the replica floors hold all the GPUs
    held (a floor in load units doubles its replicas when each gets half a GPU)."""
    nearest = next((f for f in cfg.allowed if f > current), None)
    if g is None or nearest is None:
        return None
    after = math.ceil(g * current / nearest)
    if after >= g or upper * g > more_at * after:
        return (
            f"demand {upper * g / 100:.2f} GPUs would not fit the {after} GPUs {nearest} "
            f"fragments leave at {more_at:g}%: more fragments would pack nothing"
        )
    floor = math.ceil(floor_gpus - 1e-9)
    if floor >= g:
        return (
            f"the replica floor holds {floor} of the {g} GPUs sized for its load (it adds "
            f"replicas as each gets a smaller share): more fragments would pack nothing"
        )
    return None


def _memory_in_use(
    used_gib: float,
    current: int,
    gpu_gib: float,
    candidates: list[int],
    limit: str,
    cfg: FragmentsConfig,
) -> tuple[list[int], str]:
    """Tenants already use this much each; a smaller share would not hold them."""
    per_tenant = used_gib / current
    usable = gpu_gib * (1 - cfg.memory_reserve_ratio) * cfg.max_memory_overcommit
    fitting = [f for f in candidates if usable / f >= per_tenant]
    if len(fitting) < len(candidates):
        refused = candidates[len(fitting)]
        limit = (
            f"memory in use: tenants hold {per_tenant:.1f} GiB each, {refused} "
            f"fragments would leave {usable / refused:.1f} GiB"
        )
    return fitting, limit
