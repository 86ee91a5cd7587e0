"""Replica floor of a workload (KEDA ScaledObject minReplicaCount or HPA minReplicas).

The HPA formula, desired = ceil(load / target), applied to the forecast's upper bound over
the horizon instead of the current value: the floor rises before the load does, and the
reactive autoscaler above it keeps the ceiling (effective replicas = max(floor, reactive)).
Scale-down only to the highest recommendation of the stabilization window; steps bounded.
The forecast must earn the floor: it is scored every tick against reactive sizing on the
observed series (gpuscaler.core.skill); until it has shown skill, and whenever it loses
it, the floor steps back to min_replicas and the reactive autoscaler alone decides.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Final

import numpy as np

from gpuscaler.config import ReplicasConfig
from gpuscaler.core.guards import Outcome, cooling_down, hold, input_problem, invalid
from gpuscaler.core.model import Decision, TargetHistory, WorkloadObservation
from gpuscaler.core.skill import assess, in_fallback, remember

KIND: Final = "replica_floor"


def hpa_desired(load_gpu_pct: float, replica_gpu_share: float, target_pct: float) -> int:
    """The HPA formula, ceil(sum of replica utilization / target), with the sum of replica
    utilization written as GPU load over the GPU share of one replica."""
    return math.ceil(load_gpu_pct / (replica_gpu_share * target_pct) - 1e-9)


def decide_replica_floor(
    obs: WorkloadObservation,
    cfg: ReplicasConfig,
    staleness: float,
    h: TargetHistory,
    now: float,
) -> Outcome:
    target = obs.key
    problem = input_problem(obs.load, now, staleness)
    if problem is not None:
        return invalid(KIND, target, now, problem, h)
    if obs.floor is None:
        return invalid(KIND, target, now, "current replica floor unknown", h)
    forecast = obs.load.forecast
    assert forecast is not None
    current = obs.floor
    upper = forecast.peak_upper_within(cfg.lead_time)
    ceiling = min(cfg.max_replicas, obs.max_replicas or cfg.max_replicas)
    mean_peak = float(np.max(forecast.mean[: max(1, round(cfg.lead_time / forecast.step))]))
    h, fallback = _skill_check(h, cfg, now, forecast.last_value, upper, mean_peak)
    capacity, sizing = _capacity(obs, cfg)
    raw = math.ceil(upper / capacity - 1e-9)  # the HPA formula, as hpa_desired
    # Within tolerance of the current floor: no change (the HPA's own 10 % dead band).
    usage_ratio = upper / (capacity * current) if current else 0.0
    if current > 0 and abs(usage_ratio - 1) <= cfg.tolerance:
        raw = current
    if fallback is not None:
        raw = cfg.min_replicas  # no skill: the reactive autoscaler alone decides
    recommended = max(cfg.min_replicas, min(ceiling, raw))
    window_start = now - cfg.scale_down_stabilization
    recs = (*tuple(r for r in h.recommendations if r[0] > window_start), (now, recommended))
    h = replace(h, recommendations=recs)
    # Scale down only to the highest recommendation in the window.
    stabilized = max(v for _, v in recs) if recommended < current else recommended
    digits = 1 if obs.serving else 0
    why = fallback or f"forecast upper {upper:.{digits}f}{sizing} -> {raw} replicas"
    if stabilized == current:
        extra = (
            ""
            if stabilized == recommended
            else (f", held by the {cfg.scale_down_stabilization:.0f}s stabilization window")
        )
        return hold(KIND, target, now, f"hold: {why}, floor stays {current}{extra}", h)
    left = cooling_down(h, now, cfg.cooldown)
    if left > 0:
        return hold(KIND, target, now, f"cooldown: {why}, {left:.0f}s left", h)
    if stabilized > current:
        to = min(stabilized, current + cfg.max_step_up)
        bound = (
            f"max step up {cfg.max_step_up}" if to < stabilized else _bound(raw, to, cfg, ceiling)
        )
    else:
        to = max(stabilized, current - cfg.max_step_down)
        if to > stabilized:
            bound = f"max step down {cfg.max_step_down}"
        elif stabilized > recommended:
            bound = f"stabilization window {cfg.scale_down_stabilization:.0f}s"
        else:
            bound = _bound(raw, to, cfg, ceiling)
    decision = Decision(
        time=now,
        kind=KIND,
        target=target,
        from_value=current,
        to_value=to,
        reason=f"{why}; floor {current} -> {to} ({bound}); {forecast.reason}",
        forecast={"peak": forecast.peak, "upper": upper, "last": forecast.last_value},
    )
    return Outcome(h, decision=decision)


def _capacity(obs: WorkloadObservation, cfg: ReplicasConfig) -> tuple[float, str]:
    """What one replica serves at target, in the load's unit, and how that reads: GPU
    percent (a GPU share times the target utilization) or the serving stack's demand."""
    if obs.serving is not None:
        per_replica, unit = obs.serving
        return per_replica, f" {unit} / {per_replica:g} per replica"
    share = obs.replica_gpu_share
    return (
        share * cfg.target_utilization_pct,
        f"% GPU / ({share:g} GPU x target {cfg.target_utilization_pct:g}%)",
    )


def _skill_check(
    h: TargetHistory, cfg: ReplicasConfig, now: float, value: float, upper: float, mean: float
) -> tuple[TargetHistory, str | None]:
    """History with this tick scored, and the reason when the floor steps back to
    reactive because the forecast has had no skill (None when it keeps the floor)."""
    if not cfg.skill_check:
        return h, None
    keep = cfg.skill_window + max(cfg.lead_time, cfg.scale_down_stabilization)
    h = remember(h, now, value, upper, mean, keep)
    skill = assess(h, now, cfg.lead_time, cfg.scale_down_stabilization, cfg.skill_min_origins)
    fallback = in_fallback(h, skill, cfg.skill_fallback_below, cfg.skill_return_above)
    h = replace(h, fallback=fallback)
    if not fallback:
        return h, None
    score = "none yet" if skill.score is None else f"{skill.score:.2f}"
    return h, (
        f"skill fallback: the forecast's skill over the last {skill.origins} origins is "
        f"{score} (below {cfg.skill_return_above:g} to return: it avoided no more of the "
        f"reactive shortfall than flat headroom or a level floor at the same cost would); "
        f"the floor steps back to min {cfg.min_replicas} and the reactive autoscaler "
        f"decides (forecast upper bound {upper:.0f}% unused)"
    )


def _bound(raw: int, to: int, cfg: ReplicasConfig, ceiling: int) -> str:
    if raw > to and to == ceiling:
        return f"max replicas {ceiling}"
    if raw < to and to == cfg.min_replicas:
        return f"min replicas {cfg.min_replicas}"
    return "HPA formula"
