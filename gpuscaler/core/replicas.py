"""Replica floor of a workload (KEDA ScaledObject minReplicaCount or HPA minReplicas).

The HPA formula, desired = ceil(load / target), applied to the forecast's upper bound over
the horizon instead of the current value: the floor rises before the load does, and the
reactive autoscaler above it keeps the ceiling (effective replicas = max(floor, reactive)).
Scale-down only to the highest recommendation of the stabilization window; steps bounded.
The floor sizes at least for the workload's observed demand (its request rate: not
censored at capacity like the utilization the HPA reads); the forecast must earn the
rest: it is scored every tick against that reactive sizing on the observed series
(gpuscaler.core.skill), and until it has shown skill, and whenever it loses it, the
forecast is set aside and the reason says so. A burst that outran reactive sizing keeps
a reserve (gpuscaler.core.reserve). Step limits are in GPUs.

A tick decides every workload's floor at once, in three steps: each workload's input is
checked and its tick record made (`_record`); the records are remembered and the
forecasts' skill, the burst reserves and the observed peaks taken over rows of the
workloads whose records share their times (`_judged`); each floor is then sized,
stabilized and stepped, with its reason (`_floor`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Final, NamedTuple

import numpy as np

from gpuscaler.config import ReplicasConfig
from gpuscaler.core.decisions import ReplicaFloorDecision
from gpuscaler.core.guards import Outcome, cooling_down, hold, input_problem, invalid
from gpuscaler.core.model import FloatArray, TargetHistory, WorkloadObservation
from gpuscaler.core.peaks import window_max
from gpuscaler.core.reserve import Reserve, overflow_reserves
from gpuscaler.core.skill import Skill, assess, in_fallback

KIND: Final = "replica_floor"

FloorInput = tuple[WorkloadObservation, ReplicasConfig, TargetHistory]
"""A workload's observation, its section of the config and its history before the tick."""


class _Tick(NamedTuple):
    """A workload's tick record (time, observed demand, forecast upper bound and mean
    peak over the lead time; NaN without a forecast) and, without a forecast, why."""

    record: tuple[float, float, float, float]
    note: str | None


class _Judged(NamedTuple):
    """What a workload's records say this tick."""

    seen: FloatArray
    """Its records with this tick's, for its history."""
    skill: Skill | None
    """Its forecast's skill (None: `skill_check` is off)."""
    reserve: Reserve | None
    peak: float
    """The highest demand observed in the stabilization window, this tick included."""


def replica_floors(workloads: Sequence[FloorInput], staleness: float, now: float) -> list[Outcome]:
    """The floor outcome of each workload, in order."""
    outcomes: list[Outcome | None] = [None] * len(workloads)
    ticks: dict[int, _Tick] = {}
    groups: dict[tuple[bytes, tuple[float, ...]], list[int]] = {}
    for i, (obs, cfg, h) in enumerate(workloads):
        found = _record(obs, cfg, staleness, h, now)
        if isinstance(found, Outcome):
            outcomes[i] = found
        else:
            ticks[i] = found
            groups.setdefault((h.seen[:, 0].tobytes(), _params(cfg)), []).append(i)
    for idx in groups.values():
        rows = [workloads[i] for i in idx]
        judged = _judged(rows, [ticks[i].record for i in idx], now)
        for i, row, said in zip(idx, rows, judged, strict=True):
            outcomes[i] = _floor(*row, ticks[i], said, now)
    return [o for o in outcomes if o is not None]


def hpa_desired(load_gpu_pct: float, replica_gpu_share: float, target_pct: float) -> int:
    """The HPA formula, ceil(sum of replica utilization / target), with the sum of replica
    utilization written as GPU load over the GPU share of one replica."""
    return _replicas_for(load_gpu_pct, replica_gpu_share * target_pct)


def _replicas_for(demand: float, per_replica: float) -> int:
    """Replicas that serve `demand` at `per_replica` each (a rounding error is no replica)."""
    return math.ceil(demand / per_replica - 1e-9)


def _params(cfg: ReplicasConfig) -> tuple[float, ...]:
    """The parameters a workload's records are judged with: workloads with the same
    parameters and record times are judged together."""
    return (
        cfg.lead_time,
        cfg.scale_down_stabilization,
        float(cfg.skill_check),
        cfg.skill_min_origins,
        cfg.skill_window,
        cfg.reserve_window,
    )


def _record(
    obs: WorkloadObservation,
    cfg: ReplicasConfig,
    staleness: float,
    h: TargetHistory,
    now: float,
) -> Outcome | _Tick:
    """The floor's outcome when the input cannot be acted on, else the tick's record."""
    problem = input_problem(obs.load, now, staleness)
    if problem is not None and not _reactive_only(obs, now, staleness):
        return invalid(KIND, obs.key, now, problem, h)
    if obs.floor is None:
        return invalid(KIND, obs.key, now, "current replica floor unknown", h)
    forecast, peak = obs.load.forecast, obs.recent_peak
    if forecast is None:
        # No forecast yet (too little history): reactive on the observed demand alone.
        assert peak is not None
        note = f"no forecast ({problem}): the floor sizes for the observed demand alone"
        return _Tick((now, peak, math.nan, math.nan), note)
    upper = forecast.peak_upper_within(cfg.lead_time)
    mean_peak = float(np.max(forecast.mean[: max(1, round(cfg.lead_time / forecast.step))]))
    observed = peak if peak is not None and math.isfinite(peak) else forecast.last_value
    return _Tick((now, observed, upper, mean_peak), None)


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


def _judged(rows: list[FloorInput], records: list[tuple[float, ...]], now: float) -> list[_Judged]:
    """The records of workloads with the same parameters and record times, this tick's
    added and those older than the skill and reserve windows need dropped, and what they
    say: the forecast's skill, the burst reserve, the observed peak. Over rows."""
    cfg = rows[0][1]
    old = np.stack([h.seen for _, _, h in rows])
    t = old[0, :, 0]
    window = cfg.scale_down_stabilization
    keep = max(cfg.skill_window, cfg.reserve_window) + max(cfg.lead_time, window)
    # Records are in time order: those kept are a run, the newest but any of this tick's
    # time or later (the clock went back), which this tick's record replaces.
    start, stop = int(np.searchsorted(t, now - keep, "right")), int(np.searchsorted(t, now))
    recs = np.concatenate((old[:, start:stop], np.asarray(records)[:, None, :]), axis=1)
    skills: list[Skill | None] = [None] * len(rows)
    if cfg.skill_check:
        span = cfg.skill_window + max(cfg.lead_time, window)
        skills[:] = assess(recs, now, cfg.lead_time, window, cfg.skill_min_origins, span)
    sizes = np.asarray([_reserve_sizes(obs, section) for obs, section, _ in rows])
    reserves = overflow_reserves(recs, now, window, cfg.reserve_window, sizes[:, 0], sizes[:, 1])
    times, values = recs[0, :, 0], recs[:, :, 1]
    first = min(int(np.searchsorted(times, now - window, "right")), len(times) - 1)
    finite = np.where(np.isfinite(values), values, -np.inf)
    peaks = window_max(finite, np.asarray([first]), np.asarray([len(times)]))[:, 0].tolist()
    # Each history its own copy: a history kept after its workload is gone holds its
    # records alone, not the whole tick's.
    seen = [row.copy() for row in recs]
    for s in seen:
        s.setflags(write=False)
    return [_Judged(*found) for found in zip(seen, skills, reserves, peaks, strict=True)]


def _reserve_sizes(obs: WorkloadObservation, cfg: ReplicasConfig) -> tuple[float, float]:
    """What one replica serves at the target and at full use, in the load's unit: the
    overflow reserve's `at_target` and `full` (GPU percent, or the serving stack's
    demand, which a replica serves at its rate either way)."""
    if obs.serving is not None:
        per_replica = obs.serving[0]
        return per_replica, per_replica
    at_target = obs.replica_gpu_share * cfg.target_utilization_pct
    return at_target, at_target * 100.0 / cfg.target_utilization_pct


def _floor(
    obs: WorkloadObservation,
    cfg: ReplicasConfig,
    h: TargetHistory,
    tick: _Tick,
    judged: _Judged,
    now: float,
) -> Outcome:
    """The floor for the observed peak, or the forecast's upper bound when higher and
    the forecast has skill, or the burst reserve when that asks for more; stabilized
    and stepped, with its reason."""
    target, current, share = obs.key, obs.floor, obs.replica_gpu_share
    assert current is not None
    fallback, note, upper = _skill_check(h.fallback, obs, cfg, tick, judged.skill)
    observed = judged.peak
    sized = observed if upper is None else max(observed, upper)
    ceiling = min(cfg.max_replicas, obs.max_replicas or cfg.max_replicas)
    capacity, full = _reserve_sizes(obs, cfg)
    reserve = judged.reserve
    kept = 0 if reserve is None else _replicas_for(reserve.peak, full)
    raw = _raw(cfg, sized, capacity, current)
    if reserve is not None and kept > raw:
        said = _reserve_text(reserve, cfg, kept)
        note = f"{note}; {said}" if note else said
    raw = max(raw, kept)
    # Clamped here, once: never above the object's own maximum, even for min_replicas.
    recommended = min(ceiling, max(cfg.min_replicas, raw))
    recent, stabilized = _stabilized(h, cfg, now, sized, capacity, current, ceiling, recommended)
    h = replace(h, recommendations=recent, seen=judged.seen, fallback=fallback)
    why = _why(obs, cfg, note, sized, observed, raw)
    if stabilized == current:
        by = (
            f", held by the stabilization window{_margin(cfg)}" if stabilized != recommended else ""
        )
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
    forecast = obs.load.forecast
    decision = ReplicaFloorDecision(
        time=now,
        target=target,
        from_value=current,
        to_value=to,
        reason=f"{why}; floor {current} -> {to} ({bound})"
        + ("" if forecast is None else f"; {forecast.reason}"),
        forecast={"last": observed}
        if forecast is None
        else {"peak": forecast.peak, "upper": tick.record[2], "last": forecast.last_value},
    )
    return Outcome(h, decision=decision)


def _skill_check(
    fallback: bool,
    obs: WorkloadObservation,
    cfg: ReplicasConfig,
    tick: _Tick,
    skill: Skill | None,
) -> tuple[bool, str | None, float | None]:
    """Whether the forecast is set aside for its skill after this tick (`fallback`:
    before it), why it is set aside (None: it is not), and its upper bound when it counts
    (None: set aside, or no forecast)."""
    _, observed, upper, _ = tick.record
    if obs.load.forecast is None:
        return fallback, tick.note, None
    if skill is None:  # skill_check off: the forecast always counts
        return fallback, None, upper
    fallback = in_fallback(fallback, skill, cfg.skill_fallback_below, cfg.skill_return_above)
    if not fallback:
        return fallback, None, upper
    score = "none yet" if skill.score is None else f"{skill.score:.2f}"
    unused = "" if upper <= observed else f" (forecast upper bound {upper:.0f}% unused)"
    note = (
        f"skill fallback: the forecast's skill over the last {skill.origins} origins is "
        f"{score} (below {cfg.skill_return_above:g} to return: it avoided no more of the "
        f"reactive shortfall than flat headroom or a level floor at the same cost would); "
        f"the floor sizes for the observed demand alone{unused}"
    )
    return fallback, note, None


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


def _stabilized(
    h: TargetHistory,
    cfg: ReplicasConfig,
    now: float,
    sized: float,
    capacity: float,
    current: int,
    ceiling: int,
    recommended: int,
) -> tuple[tuple[tuple[float, int], ...], int]:
    """Scale down only to the highest recommendation of the window, as the HPA does, kept
    as the load sized for (percent of a GPU) so a fragment change, which changes each
    replica's share, does not distort it; and only to a count the window's demand fits
    with `scale_down_margin` below its capacity. Returns the window's recommendations
    with this tick's, and the floor the window allows."""
    window_start = now - cfg.scale_down_stabilization
    recent = (*[r for r in h.recommendations if r[0] > window_start], (now, math.ceil(sized)))
    if recommended >= current:  # no scale-down: nothing for the window to hold
        return recent, recommended
    held_for = max([v for _, v in recent])
    held = max(cfg.min_replicas, min(ceiling, _replicas_for(held_for, capacity)))
    stabilized = max(recommended, min(current, held))
    margin = cfg.scale_down_margin
    if stabilized < current and margin > 0:
        kept = min(current, _replicas_for(held_for, capacity * (1 - margin)))
        stabilized = max(stabilized, min(ceiling, kept))
    return recent, stabilized


def _raw(cfg: ReplicasConfig, sized: float, capacity: float, current: int) -> int:
    """Replicas for `sized` demand by the HPA formula in the load's unit, none changed
    within the tolerance (the floor's reserve may ask for more: `_floor`)."""
    raw = _replicas_for(sized, capacity)
    # Within tolerance of the current floor: no change (the HPA's own 10 % dead band).
    usage_ratio = sized / (capacity * current) if current else 0.0
    if current > 0 and abs(usage_ratio - 1) <= cfg.tolerance:
        raw = current
    return raw


def _reserve_text(r: Reserve, cfg: ReplicasConfig, replicas: int) -> str:
    """Why the floor keeps `replicas` for bursts that overflowed what reactive sizing
    would have had at full use (`r`, gpuscaler.core.reserve)."""
    return (
        f"reserve {replicas} replicas: demand {r.peak:.0f} outran reactive sizing at full use "
        f"{r.overflows} time(s) in the last {cfg.reserve_window:.0f}s (highest {r.age:.0f}s "
        "ago); new replicas come too late for bursts that short"
    )


def _why(
    obs: WorkloadObservation,
    cfg: ReplicasConfig,
    note: str | None,
    sized: float,
    observed: float,
    raw: int,
) -> str:
    """A floor's reason up to its verdict: the note, and the demand sized for -> the
    replicas."""
    source = (
        f"observed peak {_value(obs, cfg, sized)} (highest of {cfg.scale_down_stabilization:.0f}s)"
        if sized == observed
        else f"forecast upper {_value(obs, cfg, sized)}"
    )
    return f"{note}; {source} -> {raw} replicas" if note else f"{source} -> {raw} replicas"


def _value(obs: WorkloadObservation, cfg: ReplicasConfig, sized: float) -> str:
    """The demand sized for, and how what one replica serves at target reads: GPU
    percent (a GPU share times the target utilization) or the serving stack's demand."""
    if obs.serving is not None:
        return f"{sized:.1f} {obs.serving[1]} / {obs.serving[0]:g} per replica"
    share = obs.replica_gpu_share
    return f"{sized:.0f}% GPU / ({share:g} GPU x target {cfg.target_utilization_pct:g}%)"


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
