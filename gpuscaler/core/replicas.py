"""Replica floor of a workload (KEDA ScaledObject minReplicaCount or HPA minReplicas).

The HPA formula, desired = ceil(load / target), applied to the forecast's upper bound over
the horizon instead of the current value: the floor rises before the load does, and the
reactive autoscaler above it keeps the ceiling (effective replicas = max(floor, reactive)).
Scale-down only to the highest recommendation of the stabilization window; steps bounded.
The floor sizes at least for the workload's observed demand (its request rate: not
censored at capacity like the utilization the HPA reads); the forecast must earn the
rest: it is scored every tick against that reactive sizing on the observed series
(gpuscaler.core.skill), and until it has shown skill, and whenever it loses it, the
forecast is set aside and the reason says so. Step limits are in GPUs.
"""

from __future__ import annotations

import math
from typing import Final, NamedTuple

import numpy as np

from gpuscaler.config import ReplicasConfig
from gpuscaler.core.decisions import ReplicaFloorDecision
from gpuscaler.core.floor_rows import ForecastFigures, Record, lead_steps
from gpuscaler.core.guards import Outcome, cooling_down, held, input_problem, invalid
from gpuscaler.core.model import TargetHistory, WorkloadObservation
from gpuscaler.core.reserve import Reserve, overflow_reserve
from gpuscaler.core.skill import Skill, assess, floor_history, in_fallback, records, remember

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
    found = floor_record(obs, cfg, staleness, h, now)
    if isinstance(found, Outcome):
        return found
    record, keep, peak = found
    step = FloorStep(obs, cfg, remember(h, *record, keep), now, record[2], record[1], peak)
    skill = assess(step.history, now, *skill_args(cfg)) if cfg.skill_check else None
    return floor_outcome(step, skill, floor_reserve(step.history, obs, cfg, now))


class FloorStep(NamedTuple):
    """A replica floor decided up to its forecast's skill and its overflow reserve
    (`floor_outcome` takes it from there): the planner assesses every workload's at once
    (skill.assess_chunk, reserve.overflow_reserve_chunk). A named tuple: one a workload
    a tick, made in a third of a frozen dataclass's time."""

    obs: WorkloadObservation
    cfg: ReplicasConfig
    history: TargetHistory
    """With this tick's record."""
    now: float
    upper: float
    observed: float
    peak: float | None = None
    """The forecast's peak when taken with other workloads' (None: taken when needed)."""


def skill_args(cfg: ReplicasConfig) -> tuple[float, float, int, float]:
    """`skill.assess`'s lead, stabilization, minimum origins and span for this floor
    (over the skill window: the records may reach further back, for the reserve)."""
    span = cfg.skill_window + max(cfg.lead_time, cfg.scale_down_stabilization)
    return cfg.lead_time, cfg.scale_down_stabilization, cfg.skill_min_origins, span


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
        return _floor(obs, cfg, h, now, found, observed_peak(h, now, window), None, note)
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
    h, fallback = _skill_check(step.history, cfg, skill)
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
        None if fallback is None else (fallback, step.upper, step.observed),
        (forecast.peak if step.peak is None else step.peak, step.upper, forecast.last_value),
    )


def reserve_sizes(obs: WorkloadObservation, cfg: ReplicasConfig) -> tuple[float, float]:
    """What one replica serves at the target and at full use, in the load's unit: the
    overflow reserve's `at_target` and `full` (GPU percent, or the serving stack's
    demand, which a replica serves at its rate either way)."""
    if obs.serving is not None:
        per_replica = obs.serving[0]
        return per_replica, per_replica
    at_target = obs.replica_gpu_share * cfg.target_utilization_pct
    return at_target, at_target * 100.0 / cfg.target_utilization_pct


def floor_reserve(
    h: TargetHistory, obs: WorkloadObservation, cfg: ReplicasConfig, now: float
) -> Reserve | None:
    """The overflow reserve the floor's records call for (gpuscaler.core.reserve)."""
    at_target, full = reserve_sizes(obs, cfg)
    window, span = cfg.scale_down_stabilization, cfg.reserve_window
    return overflow_reserve(records(h), now, window, span, at_target, full)


def floor_gpus(obs: WorkloadObservation, cfg: ReplicasConfig, floor: int | None) -> float:
    """GPUs the replica floor `floor` holds sized for the workload's load (floor x GPU share
    of one replica). The floor is sized in load units, so when fragments double (each
    replica gets half the share) it doubles its replicas and holds the same GPUs. Not so
    a floor that `min_replicas` or the ceiling set, nor an unknown one: 0 for those."""
    ceiling = min(cfg.max_replicas, obs.max_replicas or cfg.max_replicas)
    if floor is None or not cfg.min_replicas < floor < ceiling:
        return 0.0
    return floor * obs.replica_gpu_share


def whole_gpus(to: int, current: int, share: float, ceiling: int) -> int:
    """The floor `to` in whole GPUs: replicas of a GPU share that packs k to a GPU are
    raised to fill the last GPU they hold (its empty slots cost no more), never above
    `ceiling`; a step down that would free no GPU stays at `current` (it only took
    capacity away). Replicas of a whole GPU or more are left as they are."""
    per_gpu = math.floor(1.0 / share + 1e-9) if share < 1.0 else 1
    if per_gpu <= 1 or to == current:
        return to
    gpus = math.ceil(to / per_gpu)
    if to < current and gpus >= math.ceil(current / per_gpu):
        return current
    return max(to, min(ceiling, gpus * per_gpu))


def observed_peak(h: TargetHistory, now: float, window: float) -> float:
    """Highest demand observed at the ticks of the last `window` seconds (each tick's
    record is the peak since the previous one), this tick included."""
    rows = records(h)
    t = rows[:, 0]
    # The same values in the same order as the records': max() breaks ties (and NaN) alike.
    values: list[float] = rows[(t > now - window) | (t == now), 1].tolist()
    return max(values)


def _reactive_only(obs: WorkloadObservation, now: float, staleness: float) -> bool:
    """Whether the floor can still size for the observed demand: the forecast alone is
    missing (too little history), the load's own samples are fresh and finite."""
    load = obs.load
    return (
        load.forecast is None
        and obs.recent_peak is not None
        and math.isfinite(obs.recent_peak)
        and load.last_sample_time is not None
        and now - load.last_sample_time <= staleness
    )


Note = str | tuple[Skill, float, float] | None
"""Why the forecast is set aside: a text, or the skill that did with the forecast's upper
bound and the observed demand (`_fallback_text`, made when read); None: it counts."""

Why = tuple[WorkloadObservation, ReplicasConfig, Note, bool, Reserve | None, int, float, float, int]
"""`_why`'s arguments: a floor's reason before its verdict, made when read."""


def _floor(
    obs: WorkloadObservation,
    cfg: ReplicasConfig,
    h: TargetHistory,
    now: float,
    reserve: Reserve | None,
    observed: float,
    upper: float | None,
    note: Note,
    figures: tuple[float, float, float] | None = None,
) -> Outcome:
    """The floor for `observed` demand, or the forecast's `upper` bound when higher
    (None: the forecast is set aside, `note` says why), stabilized and stepped.
    `figures`: the forecast's peak, upper bound and last value, for a decision (None: no
    forecast). A hold's reason is made when first read (`guards.held`)."""
    target, current, share = obs.key, obs.floor, obs.replica_gpu_share
    assert current is not None
    ceiling = min(cfg.max_replicas, obs.max_replicas or cfg.max_replicas)
    sized = observed if upper is None else max(observed, upper)
    capacity, full = reserve_sizes(obs, cfg)
    kept = 0 if reserve is None else math.ceil(reserve.peak / full - 1e-9)
    raw = _raw(cfg, sized, capacity, current)
    reserved = kept > raw
    if reserved:
        raw = kept
    # Clamped here, once: never above the object's own maximum, even for min_replicas.
    recommended = min(ceiling, max(cfg.min_replicas, raw))
    h, stabilized = _stabilized(h, cfg, now, sized, capacity, current, ceiling, recommended)
    why: Why = (obs, cfg, note, reserved, reserve, kept, sized, observed, raw)
    if stabilized == current:
        return held(KIND, target, now, h, _hold_text, (why, current, stabilized != recommended))
    left = cooling_down(h, now, cfg.cooldown)
    if left > 0:
        return held(KIND, target, now, h, _cooldown_text, (why, left))
    to, bound = _stepped(current, stabilized, recommended, raw, share, cfg, ceiling)
    filled = whole_gpus(to, current, share, ceiling) if cfg.whole_gpus else to
    if filled == current:
        return held(KIND, target, now, h, _frees_text, (why, current, to))
    if filled != to:
        to, bound = filled, f"{bound}, filled to whole GPUs"
    forecast = obs.load.forecast
    tail = "" if figures is None or forecast is None else f"; {forecast.reason}"
    decision = ReplicaFloorDecision(
        time=now,
        target=target,
        from_value=current,
        to_value=to,
        reason=f"{_why(*why)}; floor {current} -> {to} ({bound}){tail}",
        forecast=_figures(observed, figures),
    )
    return Outcome(h, decision=decision)


def _why(
    obs: WorkloadObservation,
    cfg: ReplicasConfig,
    note: Note,
    reserved: bool,
    reserve: Reserve | None,
    kept: int,
    sized: float,
    observed: float,
    raw: int,
) -> str:
    """A floor's reason up to its verdict: the note, the reserve when it set the
    replicas, and the demand sized for -> the replicas."""
    text = note if note is None or isinstance(note, str) else _fallback_text(cfg, *note)
    if reserved:
        said = _reserve_text(reserve, cfg, kept)
        text = f"{text}; {said}" if text else said
    value = f"{sized:.{1 if obs.serving else 0}f}{_sizing(obs, cfg)}"
    source = (
        f"observed peak {value} (highest of {cfg.scale_down_stabilization:.0f}s)"
        if sized == observed
        else f"forecast upper {value}"
    )
    why = f"{source} -> {raw} replicas"
    return f"{text}; {why}" if text else why


def _hold_text(why: Why, current: int, by_window: bool) -> str:
    by = f", held by the stabilization window{_margin(why[1])}" if by_window else ""
    return f"hold: {_why(*why)}, floor stays {current}{by}"


def _cooldown_text(why: Why, left: float) -> str:
    return f"cooldown: {_why(*why)}, {left:.0f}s left"


def _frees_text(why: Why, current: int, to: int) -> str:
    frees = f"floor stays {current}: {to} replicas would free no GPU (whole GPUs)"
    return f"hold: {_why(*why)}, {frees}"


def _figures(observed: float, figures: tuple[float, float, float] | None) -> dict[str, float]:
    """A decision's forecast figures: the forecast's peak, upper bound and last value, or
    the observed demand alone (no forecast)."""
    if figures is None:
        return {"last": observed}
    return {"peak": figures[0], "upper": figures[1], "last": figures[2]}


def _stabilized(
    h: TargetHistory,
    cfg: ReplicasConfig,
    now: float,
    sized: float,
    capacity: float,
    current: int,
    ceiling: int,
    recommended: int,
) -> tuple[TargetHistory, int]:
    """Scale down only to the highest recommendation of the window, as the HPA does, kept
    as the load sized for (percent of a GPU) so a fragment change, which changes each
    replica's share, does not distort it; and only to a count the window's demand fits
    with `scale_down_margin` below its capacity."""
    window_start = now - cfg.scale_down_stabilization
    recent = [r for r in h.recommendations if r[0] > window_start]
    recent.append((now, math.ceil(sized)))
    h = floor_history(h, recommendations=tuple(recent))
    if recommended >= current:  # no scale-down: nothing for the window to hold
        return h, recommended
    held_for = max([v for _, v in recent])
    held = max(cfg.min_replicas, min(ceiling, math.ceil(held_for / capacity - 1e-9)))
    stabilized = max(recommended, min(current, held))
    margin = cfg.scale_down_margin
    if stabilized < current and margin > 0:
        kept = min(current, math.ceil(held_for / (capacity * (1 - margin)) - 1e-9))
        stabilized = max(stabilized, min(ceiling, kept))
    return h, stabilized


def _raw(cfg: ReplicasConfig, sized: float, capacity: float, current: int) -> int:
    """Replicas for `sized` demand by the HPA formula (hpa_desired) in the load's unit,
    none changed within the tolerance (the floor's reserve may ask for more: `_floor`)."""
    raw = math.ceil(sized / capacity - 1e-9)
    # Within tolerance of the current floor: no change (the HPA's own 10 % dead band).
    usage_ratio = sized / (capacity * current) if current else 0.0
    if current > 0 and abs(usage_ratio - 1) <= cfg.tolerance:
        raw = current
    return raw


def _reserve_text(r: Reserve | None, cfg: ReplicasConfig, replicas: int) -> str:
    """Why the floor keeps `replicas` for bursts that overflowed what reactive sizing
    would have had at full use (`r`, gpuscaler.core.reserve); "" when none did."""
    if r is None:
        return ""
    return (
        f"reserve {replicas} replicas: demand {r.peak:.0f} outran reactive sizing at full use "
        f"{r.overflows} time(s) in the last {cfg.reserve_window:.0f}s (highest {r.age:.0f}s "
        "ago); new replicas come too late for bursts that short"
    )


def _sizing(obs: WorkloadObservation, cfg: ReplicasConfig) -> str:
    """How what one replica serves at target reads: GPU percent (a GPU share times the
    target utilization) or the serving stack's demand."""
    if obs.serving is not None:
        return f" {obs.serving[1]} / {obs.serving[0]:g} per replica"
    share = obs.replica_gpu_share
    return f"% GPU / ({share:g} GPU x target {cfg.target_utilization_pct:g}%)"


def _skill_check(
    h: TargetHistory, cfg: ReplicasConfig, skill: Skill | None
) -> tuple[TargetHistory, Skill | None]:
    """History with the skill verdict, and the skill when the forecast is set aside
    because it has had no skill (None when it may raise the floor)."""
    if not cfg.skill_check or skill is None:
        return h, None
    fallback = in_fallback(h, skill, cfg.skill_fallback_below, cfg.skill_return_above)
    if fallback != h.fallback:
        h = floor_history(h, fallback=fallback)
    return h, skill if fallback else None


def _fallback_text(cfg: ReplicasConfig, skill: Skill, upper: float, observed: float) -> str:
    """Why the forecast is set aside: its skill."""
    score = "none yet" if skill.score is None else f"{skill.score:.2f}"
    unused = "" if upper <= observed else f" (forecast upper bound {upper:.0f}% unused)"
    return (
        f"skill fallback: the forecast's skill over the last {skill.origins} origins is "
        f"{score} (below {cfg.skill_return_above:g} to return: it avoided no more of the "
        f"reactive shortfall than flat headroom or a level floor at the same cost would); "
        f"the floor sizes for the observed demand alone{unused}"
    )


def _stepped(
    current: int,
    stabilized: int,
    recommended: int,
    raw: int,
    share: float,
    cfg: ReplicasConfig,
    ceiling: int,
) -> tuple[int, str]:
    """The floor after this change, within the step limits (in GPUs), and what bound it."""
    if stabilized > current:
        up = max(current, math.floor(cfg.max_step_up_gpus / share + 1e-9), 1)
        to = min(stabilized, current + up)
        if to < stabilized:
            return to, f"max step up {cfg.max_step_up_gpus:g} GPUs or double, {up} replicas"
        return to, _bound(raw, to, cfg, ceiling)
    down_gpus = cfg.max_step_down_gpus
    down = current if down_gpus is None else max(1, math.floor(down_gpus / share + 1e-9))
    to = max(stabilized, current - down)
    if to > stabilized:
        return to, f"max step down {down_gpus:g} GPUs, {down} replicas"
    if stabilized > recommended:
        return to, f"stabilization window {cfg.scale_down_stabilization:.0f}s{_margin(cfg)}"
    return to, _bound(raw, to, cfg, ceiling)


def _margin(cfg: ReplicasConfig) -> str:
    m = cfg.scale_down_margin
    return f" and the {100 * m:g}% scale-down margin" if m > 0 else ""


def _bound(raw: int, to: int, cfg: ReplicasConfig, ceiling: int) -> str:
    if raw > to and to == ceiling:
        return f"max replicas {ceiling}"
    if raw < to and to == cfg.min_replicas:
        return f"min replicas {cfg.min_replicas}"
    return "HPA formula"
