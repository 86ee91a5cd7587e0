"""A replica floor's verdict and its reason on a table of edge cases, and properties of
the floor on generated workloads: never below reactive sizing for the observed peak,
steps limited in GPUs, the scale-down margin, whole GPUs, a forecast without skill set
aside with a reason saying so."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
from builders import NOW, floor_of, history, signal, workload_obs
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.config import ReplicasConfig
from gpuscaler.core.decisions import ReplicaFloorDecision
from gpuscaler.core.guards import Outcome
from gpuscaler.core.model import Signal, TargetHistory, WorkloadObservation

TICK = 30.0
CFG = ReplicasConfig()
NO_SKILL = ReplicasConfig(skill_check=False)


def recorded(values: np.ndarray, upper: np.ndarray, mean: np.ndarray) -> TargetHistory:
    """A history whose tick records are `values` observed with the forecast's `upper`
    bound and `mean` peak, one a tick, the last a tick before NOW."""
    t = NOW - TICK * np.arange(len(values), 0, -1)
    return TargetHistory(seen=np.stack(np.broadcast_arrays(t, values, upper, mean), axis=1))


def flat_records() -> TargetHistory:
    """An hour of a steady demand the forecast overshot: no reactive shortfall, skill 0."""
    return recorded(np.full(120, 280.0), np.full(120, 900.0), np.full(120, 280.0))


def cycle_records() -> TargetHistory:
    """An hour of a 20-minute cycle whose forecast saw the next two minutes' peak."""
    t = np.arange(124) * TICK
    values = 300 + 150 * np.sin(2 * np.pi * t / 1200.0)
    ahead = np.array([values[i + 1 : i + 5].max() for i in range(120)])
    return recorded(values[:120], ahead + 5, ahead)


def burst_records() -> TargetHistory:
    """Twenty ticks at 100 % of a GPU, a burst to 450, fifteen more at 100."""
    values = np.array([100.0] * 20 + [450.0] + [100.0] * 15)
    return recorded(values, np.full(36, np.nan), np.full(36, np.nan))


def serving(obs: WorkloadObservation, per_replica: float) -> WorkloadObservation:
    return replace(obs, serving=(per_replica, "req/s"))


@dataclass
class Row:
    name: str
    obs: WorkloadObservation
    verdict: tuple[str, int]
    """("set", to) or ("hold", the floor kept)."""
    says: tuple[str, ...]
    cfg: ReplicasConfig = NO_SKILL
    hist: TargetHistory = field(default_factory=TargetHistory)
    never: tuple[str, ...] = ()


ROWS = [
    Row("a hold within the tolerance", workload_obs(signal(280, 300)), ("hold", 4),
        ("hold: forecast upper 300% GPU / (1 GPU x target 70%) -> 4 replicas, floor stays 4",)),
    Row("a raise on the upper bound", workload_obs(signal(280, 490)), ("set", 7),
        ("forecast upper 490% GPU", "floor 4 -> 7 (HPA formula); test forecast")),
    Row("a hold by the stabilization window and its margin", workload_obs(signal(50, 60)),
        ("hold", 4), ("held by the stabilization window and the 5% scale-down margin",),
        hist=history(recs=((100, 400),))),
    Row("a cooldown", workload_obs(signal(280, 900)), ("hold", 4),
        ("cooldown: forecast upper 900%", "20s left"), hist=history(changed_ago=10)),
    Row("a step down that frees no GPU", workload_obs(signal(10, 12), floor=4, share=0.25),
        ("hold", 4), ("floor stays 4: 1 replicas would free no GPU (whole GPUs)",),
        cfg=ReplicasConfig(skill_check=False, scale_down_margin=0.0)),
    Row("filled to whole GPUs", workload_obs(signal(100, 190), floor=2, share=0.25),
        ("set", 12), ("-> 11 replicas", "(HPA formula, filled to whole GPUs)")),
    Row("no skill yet: the fallback's note", workload_obs(signal(280, 490)), ("hold", 4),
        ("skill fallback: the forecast's skill over the last 0 origins is none yet",
         "(forecast upper bound 490% unused)", "observed peak 280% GPU"), cfg=CFG),
    Row("a fallback on a score of zero", workload_obs(signal(280, 900)), ("hold", 4),
        ("origins is 0.00 (below 0.2 to return", "(forecast upper bound 900% unused)"),
        cfg=CFG, hist=flat_records()),
    Row("a fallback with the upper bound below the observed demand",
        workload_obs(signal(280, 200)), ("hold", 4), ("skill fallback",), cfg=CFG,
        never=("unused",)),
    Row("skill shown: the forecast counts", workload_obs(signal(280, 900)), ("set", 8),
        ("forecast upper 900%", "max step up 4 GPUs or double, 4 replicas"), cfg=CFG,
        hist=cycle_records(), never=("skill fallback",)),
    Row("a reserve that sets the replicas", workload_obs(signal(100, 120)), ("set", 5),
        ("reserve 5 replicas: demand 450 outran reactive sizing at full use 1 time(s) in "
         "the last 7200s (highest 480s ago)", "-> 5 replicas"), hist=burst_records()),
    Row("a reserve after the fallback's note", workload_obs(signal(100, 120)), ("set", 5),
        ("skill fallback", "; reserve 5 replicas"), cfg=CFG, hist=burst_records()),
    Row("serving demand", serving(workload_obs(signal(40, 55)), 7.5), ("set", 8),
        ("forecast upper 55.0 req/s / 7.5 per replica -> 8 replicas",)),
    Row("a floor of zero", workload_obs(signal(0, 0), floor=0), ("set", 1),
        ("(min replicas 1)",)),
    Row("a negative demand", workload_obs(signal(-300, -200)), ("set", 1),
        ("(min replicas 1)",)),
    Row("at the object's maximum", workload_obs(signal(280, 9000), max_replicas=6),
        ("set", 6), ("(max replicas 6)",)),
    Row("a step down limited in GPUs", workload_obs(signal(10, 12), floor=20), ("set", 18),
        ("(max step down 2 GPUs, 2 replicas)",),
        cfg=ReplicasConfig(skill_check=False, max_step_down_gpus=2, scale_down_margin=0.0)),
    Row("no forecast yet: the observed demand alone",
        replace(workload_obs(Signal(NOW - 1, None)), recent_peak=490.0), ("set", 7),
        ("no forecast (no forecast): the floor sizes for the observed demand alone; "
         "observed peak 490% GPU",), cfg=CFG),
]  # fmt: skip


def reason(out: Outcome) -> str:
    if out.decision is not None:
        return out.decision.reason
    assert out.skip is not None
    return out.skip.reason


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_each_edge_case_decides_and_says_why(row: Row) -> None:
    out = floor_of(row.obs, row.cfg, 120.0, row.hist, NOW)
    kind, value = row.verdict
    if kind == "set":
        assert out.decision is not None, reason(out)
        assert out.decision.to_value == value, reason(out)
    else:
        assert out.decision is None and out.skip is not None, reason(out)
        assert not out.skip.invalid_input
        assert f"floor stays {value}" in reason(out) or "cooldown" in reason(out)
    for text in row.says:
        assert text in reason(out)
    for text in row.never:
        assert text not in reason(out)


def test_a_decision_carries_the_forecasts_figures_or_the_observed_demand_alone() -> None:
    out = floor_of(workload_obs(signal(280, 490)), NO_SKILL, 120.0, TargetHistory(), NOW)
    assert isinstance(out.decision, ReplicaFloorDecision)
    assert out.decision.forecast == {"peak": 280.0, "upper": 490.0, "last": 280.0}
    obs = replace(workload_obs(Signal(NOW - 1, None)), recent_peak=490.0)
    out = floor_of(obs, CFG, 120.0, TargetHistory(), NOW)
    assert isinstance(out.decision, ReplicaFloorDecision)
    assert out.decision.forecast == {"last": 490.0}


def test_every_tick_keeps_its_record_and_the_skill_verdict() -> None:
    out = floor_of(workload_obs(signal(280, 490)), CFG, 120.0, TargetHistory(), NOW)
    assert out.history.fallback
    assert out.history.seen.tolist() == [[NOW, 280.0, 490.0, 280.0]]
    assert not out.history.seen.flags.writeable


DEMAND = st.floats(0.0, 3000.0, allow_nan=False)


@st.composite
def floors(draw: st.DrawFn, /, **fixed: object) -> tuple[WorkloadObservation, ReplicasConfig]:
    """A workload on its first tick (no history, no cooldown) and its section."""
    cfg = ReplicasConfig.model_validate(
        {
            "target_utilization_pct": draw(st.sampled_from([50.0, 70.0, 85.5, 100.0])),
            "tolerance": draw(st.sampled_from([0.0, 0.1, 0.3])),
            "min_replicas": draw(st.integers(0, 3)),
            "max_replicas": draw(st.integers(3, 40)),
            "max_step_up_gpus": draw(st.sampled_from([0.5, 1.0, 4.0])),
            "scale_down_margin": draw(st.sampled_from([0.0, 0.05, 0.3])),
            "whole_gpus": draw(st.booleans()),
            "max_step_down_gpus": draw(st.sampled_from([None, 0.5, 2.0])),
            "skill_check": draw(st.booleans()),
            **fixed,
        }
    )
    observed, upper = draw(DEMAND), draw(DEMAND)
    obs = workload_obs(
        signal(observed, upper),
        floor=draw(st.integers(0, 30)),
        max_replicas=draw(st.one_of(st.none(), st.integers(1, 40))),
        share=draw(st.sampled_from([1.0, 0.5, 0.25, 1 / 3, 2.0])),
    )
    return replace(obs, recent_peak=observed), cfg


def decided(obs: WorkloadObservation, cfg: ReplicasConfig) -> tuple[Outcome, int]:
    """The outcome of the floor and the floor after it."""
    out = floor_of(obs, cfg, 120.0, TargetHistory(), NOW)
    assert out.skip is None or not out.skip.invalid_input
    assert obs.floor is not None
    return out, obs.floor if out.decision is None else int(out.decision.to_value)


def capacity(obs: WorkloadObservation, cfg: ReplicasConfig) -> float:
    return obs.replica_gpu_share * cfg.target_utilization_pct


def ceiling(obs: WorkloadObservation, cfg: ReplicasConfig) -> int:
    return min(cfg.max_replicas, obs.max_replicas or cfg.max_replicas)


@settings(max_examples=300, deadline=None)
@given(floors())
def test_the_floor_never_goes_below_reactive_sizing_for_the_observed_peak(
    case: tuple[WorkloadObservation, ReplicasConfig],
) -> None:
    obs, cfg = case
    _, floor = decided(obs, cfg)
    assert obs.recent_peak is not None and obs.floor is not None
    reactive = math.ceil(obs.recent_peak / capacity(obs, cfg) - 1e-9)
    up = max(obs.floor, math.floor(cfg.max_step_up_gpus / obs.replica_gpu_share + 1e-9), 1)
    within_tolerance = obs.recent_peak <= capacity(obs, cfg) * obs.floor * (1 + cfg.tolerance)
    assert floor >= min(reactive, ceiling(obs, cfg), obs.floor + up) or within_tolerance


@settings(max_examples=300, deadline=None)
@given(floors(whole_gpus=False))
def test_steps_are_limited_in_gpus(case: tuple[WorkloadObservation, ReplicasConfig]) -> None:
    obs, cfg = case
    _, floor = decided(obs, cfg)
    assert obs.floor is not None
    share = obs.replica_gpu_share
    assert floor - obs.floor <= max(obs.floor, math.floor(cfg.max_step_up_gpus / share + 1e-9), 1)
    if cfg.max_step_down_gpus is not None:
        assert obs.floor - floor <= max(1, math.floor(cfg.max_step_down_gpus / share + 1e-9))


@settings(max_examples=300, deadline=None)
@given(floors(skill_check=False))
def test_a_step_down_leaves_the_scale_down_margin_below_the_capacity(
    case: tuple[WorkloadObservation, ReplicasConfig],
) -> None:
    obs, cfg = case
    _, floor = decided(obs, cfg)
    assert obs.floor is not None and obs.recent_peak is not None and obs.load.forecast
    if floor < obs.floor:
        sized = math.ceil(max(obs.recent_peak, obs.load.forecast.peak_upper))
        margin = capacity(obs, cfg) * (1 - cfg.scale_down_margin)
        assert floor >= min(ceiling(obs, cfg), math.ceil(sized / margin - 1e-9))


@settings(max_examples=300, deadline=None)
@given(floors(whole_gpus=True))
def test_a_floor_of_shared_gpus_changes_in_whole_gpus(
    case: tuple[WorkloadObservation, ReplicasConfig],
) -> None:
    obs, cfg = case
    out, floor = decided(obs, cfg)
    per_gpu = math.floor(1.0 / obs.replica_gpu_share + 1e-9)
    if out.decision is not None and per_gpu > 1 and "max step down" not in reason(out):
        assert floor % per_gpu == 0 or floor in (ceiling(obs, cfg), cfg.min_replicas)


@settings(max_examples=200, deadline=None)
@given(floors(skill_check=True))
def test_a_forecast_without_skill_is_set_aside_and_the_reason_says_so(
    case: tuple[WorkloadObservation, ReplicasConfig],
) -> None:
    obs, cfg = case
    out, _ = decided(obs, cfg)
    text = reason(out)
    assert "skill fallback" in text and "sizes for the observed demand alone" in text
    assert "observed peak" in text and not re.search(r"forecast upper -?[0-9]", text)
