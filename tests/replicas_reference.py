"""The replica floor's outcome as 3ecdbd8 decided it (issue 20's oracle,
tests/test_floor_reasons.py): every reason formatted at once, as text. Since then the
reasons of holds are made when first read and the note is the skill itself
(core/replicas.py); the decisions, skips (their reasons read) and histories must be these.
The helpers the change left as they were are imported."""

from __future__ import annotations

import math

import numpy as np

from gpuscaler.config import ReplicasConfig
from gpuscaler.core.decisions import ReplicaFloorDecision
from gpuscaler.core.floor_rows import ForecastFigures, Record, lead_steps
from gpuscaler.core.guards import Outcome, cooling_down, hold, input_problem, invalid
from gpuscaler.core.model import TargetHistory, WorkloadObservation
from gpuscaler.core.replicas import (
    KIND,
    FloorStep,
    _figures,
    _margin,
    _reactive_only,
    _stabilized,
    _stepped,
    floor_reserve,
    observed_peak,
    reserve_sizes,
    whole_gpus,
)
from gpuscaler.core.reserve import Reserve
from gpuscaler.core.skill import Skill, floor_history, in_fallback, remember


def floor_record(
    obs: WorkloadObservation,
    cfg: ReplicasConfig,
    staleness: float,
    h: TargetHistory,
    now: float,
    figures: ForecastFigures | None = None,
) -> Outcome | tuple[Record, float, float | None]:
    """The floor's outcome when it needs no skill (bad input, no forecast yet), else
    the tick's record for `remember` (time, observed, upper bound, mean peak), how long
    records are kept, and the forecast's peak when `figures` has it. `figures`: the
    forecast's reductions when taken together with other workloads'
    (floor_rows.forecast_figures), else taken here."""
    target = obs.key
    finite = None if figures is None else figures[0]
    problem = input_problem(obs.load, now, staleness, finite)
    if problem is not None and not _reactive_only(obs, now, staleness):
        return invalid(KIND, target, now, problem, h)
    if obs.floor is None:
        return invalid(KIND, target, now, "current replica floor unknown", h)
    forecast = obs.load.forecast
    window = cfg.scale_down_stabilization
    keep = max(cfg.skill_window, cfg.reserve_window) + max(cfg.lead_time, window)
    if forecast is None:
        # No forecast yet (too little history): reactive on the observed demand alone.
        assert obs.recent_peak is not None
        h = remember(h, now, obs.recent_peak, math.nan, math.nan, keep)
        note = f"no forecast ({problem}): the floor sizes for the observed demand alone"
        found = floor_reserve(h, obs, cfg, now)
        return _floor(obs, cfg, h, now, found, observed_peak(h, now, window), None, note, "")
    if figures is None:
        upper = forecast.peak_upper_within(cfg.lead_time)
        mean_peak = float(np.max(forecast.mean[: lead_steps(forecast, cfg.lead_time)]))
        peak = None
    else:
        _, upper, mean_peak, peak = figures
    observed = forecast.last_value if obs.recent_peak is None else obs.recent_peak
    return (now, observed, upper, mean_peak), keep, peak


def floor_outcome(
    step: FloorStep, skill: Skill | None, reserve: Reserve | None, peak: float | None = None
) -> Outcome:
    """The floor of `step` given its forecast's skill (None: `skill_check` is off), its
    records' overflow reserve (`floor_reserve`) and their observed peak (`observed_peak`;
    None: taken here)."""
    obs, cfg, now = step.obs, step.cfg, step.now
    forecast = obs.load.forecast
    assert forecast is not None
    window = cfg.scale_down_stabilization
    if peak is None:
        peak = observed_peak(step.history, now, window)
    h, fallback = _skill_check(step.history, cfg, step.upper, step.observed, skill)
    # Reactive on the workload's own demand signal (uncensored, unlike utilization): the
    # highest of the last stabilization window, as the predictive-floor baseline (Crane
    # EHPA / AHPA: max of the last 5 minutes) does. The forecast adds to it only while it
    # shows skill against exactly that (gpuscaler.core.skill).
    return _floor(
        obs,
        cfg,
        h,
        now,
        reserve,
        peak,
        None if fallback is not None else step.upper,
        fallback,
        f"; {forecast.reason}",
        (forecast.peak if step.peak is None else step.peak, step.upper, forecast.last_value),
    )


def _floor(
    obs: WorkloadObservation,
    cfg: ReplicasConfig,
    h: TargetHistory,
    now: float,
    reserve: Reserve | None,
    observed: float,
    upper: float | None,
    note: str | None,
    tail: str,
    figures: tuple[float, float, float] | None = None,
) -> Outcome:
    """The floor for `observed` demand, or the forecast's `upper` bound when higher
    (None: the forecast is set aside, `note` says why), stabilized and stepped.
    `figures`: the forecast's peak, upper bound and last value, for a decision."""
    target, current, share = obs.key, obs.floor, obs.replica_gpu_share
    assert current is not None
    ceiling = min(cfg.max_replicas, obs.max_replicas or cfg.max_replicas)
    sized = observed if upper is None else max(observed, upper)
    sizes = reserve_sizes(obs, cfg)
    capacity, sizing = _capacity(obs, cfg, sizes[0])
    kept = _reserve(reserve, cfg, sizes[1])
    raw, note = _raw(cfg, sized, capacity, current, kept, note)
    # Clamped here, once: never above the object's own maximum, even for min_replicas.
    recommended = min(ceiling, max(cfg.min_replicas, raw))
    h, stabilized = _stabilized(h, cfg, now, sized, capacity, current, ceiling, recommended)
    value = f"{sized:.{1 if obs.serving else 0}f}{sizing}"
    source = (
        f"observed peak {value} (highest of {cfg.scale_down_stabilization:.0f}s)"
        if sized == observed
        else f"forecast upper {value}"
    )
    why = f"{source} -> {raw} replicas"
    if note:
        why = f"{note}; {why}"
    if stabilized == current:
        scale = _margin(cfg)
        by = "" if stabilized == recommended else f", held by the stabilization window{scale}"
        return hold(KIND, target, now, f"hold: {why}, floor stays {current}{by}", h)
    left = cooling_down(h, now, cfg.cooldown)
    if left > 0:
        return hold(KIND, target, now, f"cooldown: {why}, {left:.0f}s left", h)
    to, bound = _stepped(current, stabilized, recommended, raw, share, cfg, ceiling)
    filled = whole_gpus(to, current, share, ceiling) if cfg.whole_gpus else to
    if filled == current:
        frees = f"floor stays {current}: {to} replicas would free no GPU (whole GPUs)"
        return hold(KIND, target, now, f"hold: {why}, {frees}", h)
    if filled != to:
        to, bound = filled, f"{bound}, filled to whole GPUs"
    decision = ReplicaFloorDecision(
        time=now,
        target=target,
        from_value=current,
        to_value=to,
        reason=f"{why}; floor {current} -> {to} ({bound}){tail}",
        forecast=_figures(observed, figures),
    )
    return Outcome(h, decision=decision)


def _raw(
    cfg: ReplicasConfig,
    sized: float,
    capacity: float,
    current: int,
    reserved: tuple[int, str],
    note: str | None,
) -> tuple[int, str | None]:
    """Replicas for `sized` demand by the HPA formula (hpa_desired) in the load's unit,
    none changed within the tolerance, at least the `reserved` replicas for short bursts
    (`_reserve`); the note."""
    raw = math.ceil(sized / capacity - 1e-9)
    # Within tolerance of the current floor: no change (the HPA's own 10 % dead band).
    usage_ratio = sized / (capacity * current) if current else 0.0
    if current > 0 and abs(usage_ratio - 1) <= cfg.tolerance:
        raw = current
    reserve, kept = reserved
    if reserve > raw:
        return reserve, f"{note}; {kept}" if note else kept
    return raw, note


def _reserve(r: Reserve | None, cfg: ReplicasConfig, full: float) -> tuple[int, str]:
    """Replicas the floor keeps for bursts that overflowed what reactive sizing would have
    had at full use (`r`, gpuscaler.core.reserve; `full`: a replica's), and why; (0, "")
    when none did."""
    span = cfg.reserve_window
    if r is None:
        return 0, ""
    replicas = math.ceil(r.peak / full - 1e-9)
    return replicas, (
        f"reserve {replicas} replicas: demand {r.peak:.0f} outran reactive sizing at full use "
        f"{r.overflows} time(s) in the last {span:.0f}s (highest {r.age:.0f}s ago); "
        "new replicas come too late for bursts that short"
    )


def _capacity(obs: WorkloadObservation, cfg: ReplicasConfig, capacity: float) -> tuple[float, str]:
    """What one replica serves at target (`capacity`: `reserve_sizes`' first), in the
    load's unit, and how that reads: GPU percent (a GPU share times the target
    utilization) or the serving stack's demand."""
    if obs.serving is not None:
        return capacity, f" {obs.serving[1]} / {capacity:g} per replica"
    share = obs.replica_gpu_share
    return capacity, f"% GPU / ({share:g} GPU x target {cfg.target_utilization_pct:g}%)"


def _skill_check(
    h: TargetHistory, cfg: ReplicasConfig, upper: float, observed: float, skill: Skill | None
) -> tuple[TargetHistory, str | None]:
    """History with the skill verdict, and the reason when the forecast is set aside
    because it has had no skill (None when it may raise the floor)."""
    if not cfg.skill_check or skill is None:
        return h, None
    fallback = in_fallback(h, skill, cfg.skill_fallback_below, cfg.skill_return_above)
    if fallback != h.fallback:
        h = floor_history(h, fallback=fallback)
    if not fallback:
        return h, None
    score = "none yet" if skill.score is None else f"{skill.score:.2f}"
    unused = "" if upper <= observed else f" (forecast upper bound {upper:.0f}% unused)"
    return h, (
        f"skill fallback: the forecast's skill over the last {skill.origins} origins is "
        f"{score} (below {cfg.skill_return_above:g} to return: it avoided no more of the "
        f"reactive shortfall than flat headroom or a level floor at the same cost would); "
        f"the floor sizes for the observed demand alone{unused}"
    )
