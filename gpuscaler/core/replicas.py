"""Replica floor of a workload (KEDA ScaledObject minReplicaCount or HPA minReplicas).

The HPA formula, ceil(load / target), on the highest observed demand of the stabilization
window, raised to the forecast's upper bound over the lead time while the forecast shows
skill against that reactive sizing (`assess`), and kept for bursts that outran it
(`overflow_reserves`); the reactive autoscaler above keeps the ceiling. Scale-down only to
the window's highest recommendation; steps bounded, in GPUs. Workloads whose records share
their times are judged as rows (`_judged`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final, NamedTuple

import numpy as np

from gpuscaler.config import ReplicasConfig
from gpuscaler.core.decisions import ReplicaFloorDecision
from gpuscaler.core.guards import Outcome, cooling_down, hold, input_problem, invalid
from gpuscaler.core.model import BoolArray, FloatArray, IntArray, TargetHistory, WorkloadObservation

KIND: Final = "replica_floor"

FloorInput = tuple[WorkloadObservation, ReplicasConfig, TargetHistory]
"""A workload's observation, its section of the config and its history before the tick."""


class _Tick(NamedTuple):
    record: tuple[float, float, float, float]
    note: str | None


class _Judged(NamedTuple):
    """A workload's records with this tick's, its skill (None: `skill_check` off), reserve
    and the stabilization window's highest demand."""

    seen: FloatArray
    skill: Skill | None
    reserve: Reserve | None
    peak: float


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
            # Records judged with the same parameters at the same times: together.
            params: tuple[float, ...] = (cfg.lead_time, cfg.scale_down_stabilization)
            params += (cfg.skill_check, cfg.skill_min_origins, cfg.skill_window, cfg.reserve_window)
            groups.setdefault((h.seen[:, 0].tobytes(), params), []).append(i)
    for idx in groups.values():
        rows = [workloads[i] for i in idx]
        judged = _judged(rows, [ticks[i].record for i in idx], now)
        for i, row, said in zip(idx, rows, judged, strict=True):
            outcomes[i] = _floor(*row, ticks[i], said, now)
    return [o for o in outcomes if o is not None]


def _replicas_for(demand: float, per_replica: float) -> int:
    """Replicas that serve `demand` at `per_replica` each (a rounding error is no replica)."""
    return math.ceil(demand / per_replica - 1e-9)


def _record(
    obs: WorkloadObservation, cfg: ReplicasConfig, staleness: float, h: TargetHistory, now: float
) -> Outcome | _Tick:
    """The floor's outcome when the input cannot be acted on, else the tick's record."""
    problem = input_problem(obs.load, now, staleness)
    if problem is not None and not _reactive_only(obs, now, staleness):
        return invalid(KIND, obs.key, now, problem, h)
    if obs.floor is None:
        return invalid(KIND, obs.key, now, "current replica floor unknown", h)
    forecast, peak = obs.load.forecast, obs.recent_peak
    if forecast is None:
        assert peak is not None
        note = f"no forecast ({problem}): the floor sizes for the observed demand alone"
        return _Tick((now, peak, math.nan, math.nan), note)
    upper = forecast.peak_upper_within(cfg.lead_time)
    mean_peak = float(np.max(forecast.mean[: max(1, round(cfg.lead_time / forecast.step))]))
    observed = peak if peak is not None and math.isfinite(peak) else forecast.last_value
    return _Tick((now, observed, upper, mean_peak), None)


def _reactive_only(obs: WorkloadObservation, now: float, staleness: float) -> bool:
    """No forecast yet, but fresh, finite samples: the floor sizes for them alone."""
    load = obs.load
    return (
        load.forecast is None
        and obs.recent_peak is not None
        and math.isfinite(obs.recent_peak)
        and load.last_sample_time is not None
        and now - load.last_sample_time <= staleness
    )


def _judged(rows: list[FloorInput], records: list[tuple[float, ...]], now: float) -> list[_Judged]:
    """`_Judged` of workloads with the same parameters and record times, as rows."""
    cfg = rows[0][1]
    old = np.stack([h.seen for _, _, h in rows])
    t = old[0, :, 0]
    window = cfg.scale_down_stabilization
    keep = max(cfg.skill_window, cfg.reserve_window) + max(cfg.lead_time, window)
    # Records of this tick's time or later (the clock went back) are replaced by its own.
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
    # Each history its own copy, so a kept history does not hold the whole tick's records.
    seen = [row.copy() for row in recs]
    for s in seen:
        s.setflags(write=False)
    return [_Judged(*found) for found in zip(seen, skills, reserves, peaks, strict=True)]


def _reserve_sizes(obs: WorkloadObservation, cfg: ReplicasConfig) -> tuple[float, float]:
    """What one replica serves at the target and at full use, in the load's unit."""
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
    """The floor for the observed peak, the skilled forecast's upper bound or the reserve,
    whichever is highest; stabilized and stepped, with its reason."""
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
        said = (
            f"reserve {kept} replicas: demand {reserve.peak:.0f} outran reactive sizing at full "
            f"use {reserve.overflows} time(s) in the last {cfg.reserve_window:.0f}s (highest "
            f"{reserve.age:.0f}s ago); new replicas come too late for bursts that short"
        )
        note = f"{note}; {said}" if note else said
    raw = max(raw, kept)
    # Clamped here, once: never above the object's own maximum, even for min_replicas.
    recommended = min(ceiling, max(cfg.min_replicas, raw))
    recent, stabilized = _stabilized(h, cfg, now, sized, capacity, current, ceiling, recommended)
    h = replace(h, recommendations=recent, seen=judged.seen, fallback=fallback)
    why = _why(obs, cfg, note, sized, observed, raw)
    if stabilized == current:
        held = stabilized != recommended
        by = f", held by the stabilization window{_margin(cfg)}" if held else ""
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
    fallback: bool, obs: WorkloadObservation, cfg: ReplicasConfig, tick: _Tick, skill: Skill | None
) -> tuple[bool, str | None, float | None]:
    """Whether the forecast is set aside after this tick, why, and its upper bound when it
    counts."""
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
    """GPUs the floor `floor` holds sized for the load (floor x share): the same GPUs at any
    fragment count. 0 for a floor `min_replicas` or the ceiling set, or an unknown one."""
    ceiling = min(cfg.max_replicas, obs.max_replicas or cfg.max_replicas)
    if floor is None or not cfg.min_replicas < floor < ceiling:
        return 0.0
    return floor * obs.replica_gpu_share


def whole_gpus(to: int, current: int, share: float, ceiling: int) -> int:
    """The floor `to` in whole GPUs: replicas packing k to a GPU fill the last GPU they hold
    (never above `ceiling`); a step down that frees no GPU stays at `current`."""
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
    """Scale down only to the window's highest recommendation (kept as load, which a
    fragment change does not distort), and only to a count the window's demand fits with
    `scale_down_margin` to spare. The window's recommendations, and the floor it allows."""
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
    """Replicas for `sized` demand by the HPA formula; within its tolerance, no change."""
    raw = _replicas_for(sized, capacity)
    usage_ratio = sized / (capacity * current) if current else 0.0
    if current > 0 and abs(usage_ratio - 1) <= cfg.tolerance:
        raw = current
    return raw


def _why(
    obs: WorkloadObservation,
    cfg: ReplicasConfig,
    note: str | None,
    sized: float,
    observed: float,
    raw: int,
) -> str:
    source = (
        f"observed peak {_value(obs, cfg, sized)} (highest of {cfg.scale_down_stabilization:.0f}s)"
        if sized == observed
        else f"forecast upper {_value(obs, cfg, sized)}"
    )
    return f"{note}; {source} -> {raw} replicas" if note else f"{source} -> {raw} replicas"


def _value(obs: WorkloadObservation, cfg: ReplicasConfig, sized: float) -> str:
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


# --------------------------------------------------------------------------- the records' evidence


def window_max(values: FloatArray, start: IntArray, stop: IntArray) -> FloatArray:
    """The maximum of each row of `values` over each window [start[i], stop[i]) (-inf:
    empty): level k of a sparse table holds the maxima of runs of 2**k."""
    out = np.full((values.shape[0], start.size), -np.inf)
    level = np.frexp(stop - start)[1] - 1  # floor(log2(width)); -1 for an empty window
    table = values
    for k in range(int(level.max(initial=-1)) + 1):
        if k:
            half = 1 << (k - 1)
            table = np.maximum(table[:, :-half], table[:, half:])
        at = np.flatnonzero(level == k)
        if at.size:
            out[:, at] = np.maximum(table[:, start[at]], table[:, stop[at] - (1 << k)])
    return out


@dataclass(frozen=True, slots=True)
class Skill:
    score: float | None
    """None until enough origins are scored."""
    origins: int


def assess(
    records: FloatArray,
    now: float,
    lead: float,
    stabilization: float,
    min_origins: int,
    span: float = np.inf,
) -> list[Skill]:
    """Has each row's forecast earned its floor? A counterfactual over the origins o of the
    last `span` seconds of `records` (rows, records, 4: time, observed, upper bound, mean
    peak; rows share their times). Reactive R_o: the highest value of the stabilization
    window before o; predictive P_o = max(R_o, upper bound); need Y_o: the highest value in
    (o, o + lead]. The floor's extra capacity sum(P - R) is placed two cheaper ways at the
    same cost, as flat headroom and as a level floor (recent mean plus the forecast's band);
    skill is the shortfall max(0, Y - capacity) the forecast avoided beyond the better of
    the two, as a share of the reactive shortfall (none: 0). Origins without a forecast
    are not scored; a record without a finite value is in no window."""
    t = records[0, :, 0] if records.shape[0] else np.zeros(0)
    values = records[:, :, 1]
    at = np.flatnonzero((t + lead <= now) & (t > now - span))
    if not at.size:
        return [Skill(None, 0)] * records.shape[0]
    o = t[at]
    start = np.searchsorted(t, o - stabilization, "left")
    mid = np.searchsorted(t, o, "right")
    end = np.searchsorted(t, o + lead, "right")
    finite = np.isfinite(values)
    v = np.where(finite, values, -np.inf)
    reactive, need = window_max(v, start, mid), window_max(v, mid, end)
    # The mean of the finite values of each row over each reactive window [start, mid).
    running = np.zeros((2, values.shape[0], values.shape[1] + 1))
    running[0, :, 1:] = np.where(finite, values, 0.0)
    running[1, :, 1:] = finite
    np.cumsum(running, axis=2, out=running)
    sums, counts = running[:, :, mid] - running[:, :, start]
    with np.errstate(divide="ignore", invalid="ignore"):
        level = sums / counts
    upper, mean = records[:, at, 2], records[:, at, 3]
    scored = np.isfinite(upper) & np.isfinite(mean) & (reactive > -np.inf) & (need > -np.inf)
    n = scored.sum(axis=1)
    # Unscored origins count for nothing: every capacity and need 0 there.
    reactive, need, level, upper, mean = (
        np.where(scored, x, 0.0) for x in (reactive, need, level, upper, mean)
    )
    predictive = np.maximum(reactive, upper)
    extra = (predictive - reactive).sum(axis=1)
    flat = reactive + np.where(scored, (extra / np.maximum(n, 1))[:, None], 0.0)
    base = level + (upper - mean)
    levelled = np.maximum(reactive, base + shift_at_cost(reactive, base, extra, scored)[:, None])
    short_r = _shortfall(need, reactive)
    others = np.minimum(_shortfall(need, flat), _shortfall(need, levelled))
    with np.errstate(divide="ignore", invalid="ignore"):
        scores = (others - _shortfall(need, predictive)) / short_r
    found = []
    for count, short, score in zip(n.tolist(), short_r.tolist(), scores.tolist(), strict=True):
        if count < min_origins:
            found.append(Skill(None, count))
        else:
            found.append(Skill(0.0 if short <= 1e-9 else score, count))
    return found


def in_fallback(fallback: bool, skill: Skill, below: float, above: float) -> bool:
    """Whether the floor steps back to reactive: skill under `below` engages, over `above`
    returns (hysteresis); unscored, the forecast has proven nothing."""
    if skill.score is None:
        return True
    if fallback:
        return skill.score < above
    return skill.score < below


def shift_at_cost(
    reactive: FloatArray, base: FloatArray, extra: FloatArray, scored: BoolArray
) -> FloatArray:
    """For each row, the c at which max(reactive, base + c) costs `extra` more than
    `reactive` over the scored origins: the root of g(c) = sum(max(0, c - d)) = extra,
    d = reactive - base. g is piecewise linear, rising by one per breakpoint below c, so
    the root lies on the segment after the last breakpoint where g is at most `extra`
    (extra >= 0; the lowest breakpoint where it is 0)."""
    d = np.sort(np.where(scored, reactive - base, np.inf), axis=1)
    counted = np.isfinite(d)
    d0 = np.where(counted, d, 0.0)
    below = np.cumsum(d0, axis=1) - d0  # the sum of the breakpoints before each
    at_break = np.where(counted, np.arange(d.shape[1]) * d0 - below, np.inf)
    k = np.maximum((at_break <= extra[:, None]).sum(axis=1), 1)
    summed = np.take_along_axis(below + d0, (k - 1)[:, None], axis=1)[:, 0]
    shift: FloatArray = (extra + summed) / k
    return shift


def _shortfall(need: FloatArray, capacity: FloatArray) -> FloatArray:
    found: FloatArray = np.maximum(0.0, need - capacity).sum(axis=1)
    return found


@dataclass(frozen=True)
class Reserve:
    """The span's highest demand over reactive sizing at full use, its age, the overflows."""

    peak: float
    age: float
    overflows: int


def overflow_reserves(
    records: FloatArray,
    now: float,
    window: float,
    span: float,
    at_target: FloatArray,
    full: FloatArray,
) -> list[Reserve | None]:
    """The reserve for bursts reactive sizing cannot meet in time, per row of `records` (as
    in `assess`). Each tick of the last `span` seconds is checked against what reactive
    sizing (the HPA formula on the highest demand of the `window` before it: the
    counterfactual, so a reserve does not erase its own evidence) would have served at full
    use; the highest demand that overflowed it is the reserve (None: none did). A ramp
    never overflows. `at_target`, `full`: what one replica serves at each."""
    rows = records.shape[0]
    t = records[0, :, 0] if rows else np.zeros(0)
    inspan = np.flatnonzero(t > now - span)
    if not inspan.size:
        return [None] * rows
    values = records[:, :, 1]
    v = np.where(np.isfinite(values), values, -np.inf)
    o = t[inspan]
    start, stop = np.searchsorted(t, o - window, "left"), np.searchsorted(t, o, "left")
    reactive = window_max(v, start, stop)
    replicas = np.maximum(1.0, np.ceil(reactive / at_target[:, None] - 1e-9))
    over = (v[:, inspan] > replicas * full[:, None] + 1e-9) & (reactive > -np.inf)
    counts: list[int] = over.sum(axis=1).tolist()
    # The newest of the highest.
    last = over.shape[1] - 1 - np.argmax(np.where(over, v[:, inspan], -np.inf)[:, ::-1], axis=1)
    found: list[Reserve | None] = []
    for row, (count, k) in enumerate(zip(counts, last.tolist(), strict=True)):
        top = int(inspan[k])
        found.append(Reserve(float(v[row, top]), now - float(t[top]), count) if count else None)
    return found
