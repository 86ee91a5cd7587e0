"""Replica floor: the HPA formula on the forecast's upper bound, one row per rule."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest
from builders import NOW, assert_outcome, floor_of, forecast, history, signal, workload_obs

from gpuscaler.config import ReplicasConfig
from gpuscaler.core.model import Signal, TargetHistory, WorkloadObservation
from gpuscaler.core.replicas import floor_gpus, whole_gpus

STALENESS = 120.0
FORECAST_ONLY = {"skill_check": False}
"""These rows test the forecast rule itself; the skill self-assessment that may set it
aside is tested in test_skill.py."""


@dataclass
class Row:
    obs: WorkloadObservation
    expect: tuple[str, object]
    hist: TargetHistory = field(default_factory=TargetHistory)
    cfg: dict[str, object] = field(default_factory=dict)


def nan_load() -> WorkloadObservation:
    obs = workload_obs(signal(300, 490))
    assert obs.load.forecast is not None
    obs.load.forecast.upper[-1] = np.inf
    return obs


def obs(peak: float, upper: float, **kw: Any) -> WorkloadObservation:
    return workload_obs(signal(peak, upper), **kw)


def recs(seconds_ago: float, load: int) -> TargetHistory:
    """A history recommending `load` `seconds_ago`."""
    return history(recs=((seconds_ago, load),))


ROWS = {
    "raises the floor to ceil(forecast upper bound / target)":
        Row(obs(280, 490, floor=4), ("set", 7)),
    "sizes from the upper bound, not the mean":
        Row(obs(100, 490, floor=4), ("set", 7)),
    "holds within the 10 percent tolerance of the current floor":
        Row(obs(280, 300, floor=4), ("hold", "floor stays 4")),
    "divides by the GPU share of one replica on a shared GPU":
        Row(obs(100, 140, floor=2, share=0.5), ("set", 4)),
    "adds at most max_step_up_gpus worth of replicas per change":
        Row(obs(1000, 2100, floor=2), ("set", 10), cfg={"max_step_up_gpus": 8}),
    "counts the step up in GPUs: on a quarter of a GPU each, 2 GPUs are 8 replicas": Row(
        obs(1000, 2100, floor=2, share=0.25), ("set", 10),
        cfg={"max_step_up_gpus": 2, "max_replicas": 200, "whole_gpus": False}),
    "fills the last GPU of a step up: 10 quarter-GPU replicas hold 3 GPUs, so 12 do": Row(
        obs(1000, 2100, floor=2, share=0.25), ("set", 12), cfg={"max_step_up_gpus": 2, "max_replicas": 200}),
    "fills the last GPU on the way up: 3 half-GPU replicas wanted, 4 set":
        Row(obs(50, 100, floor=1, share=0.5), ("set", 4)),
    "any count with whole_gpus off: 3 half-GPU replicas wanted, 3 set":
        Row(obs(50, 100, floor=1, share=0.5), ("set", 3), cfg={"whole_gpus": False}),
    "holds a step down that frees no GPU: 7 half-GPU replicas hold 4 GPUs as 8 do": Row(
        obs(200, 240, floor=8, share=0.5), ("hold", "floor stays 8: 7 replicas would free no GPU"),
        recs(400, 560), cfg={"scale_down_margin": 0}),
    "steps down to full GPUs: 5 half-GPU replicas wanted, 6 set (3 GPUs, from 4)":
        Row(obs(150, 170, floor=8, share=0.5), ("set", 6), recs(400, 560), cfg={"scale_down_margin": 0}),
    "may double in one step, as the HPA's default scale-up policy does":
        Row(obs(3000, 4200, floor=20), ("set", 40), cfg={"max_step_up_gpus": 4, "max_replicas": 100}),
    "never sets the floor above max_replicas":
        Row(obs(3000, 4000, floor=45), ("set", 50)),
    "never sets the floor above the object's own maximum":
        Row(obs(500, 700, floor=4, max_replicas=6), ("set", 6)),
    "the object's own maximum wins over a higher min_replicas (clamped once, here)":
        Row(obs(5, 10, floor=4, max_replicas=6), ("set", 6), cfg={"min_replicas": 8, "max_replicas": 50}),
    "never sets the floor below min_replicas":
        Row(obs(5, 10, floor=3), ("set", 2), cfg={"min_replicas": 2}),
    "scales down only to the highest recommendation in the stabilization window":
        Row(obs(100, 140, floor=8), ("set", 7), recs(100, 490), cfg={"scale_down_margin": 0}),
    "steps down only to a count the window's demand fits with the margin below it": Row(
        obs(100, 140, floor=8),
        ("hold", "floor stays 8, held by the stabilization window and the 10% scale-down margin"),
        recs(100, 490), cfg={"scale_down_margin": 0.1}),
    "steps down once the window's demand fits the lower count with the margin":
        Row(obs(100, 140, floor=8), ("set", 7), recs(100, 440), cfg={"scale_down_margin": 0.1}),
    "the margin never holds the floor above the object's own maximum": Row(
        obs(100, 140, floor=8, max_replicas=6), ("set", 6), recs(100, 490), cfg={"scale_down_margin": 0.1}),
    "holds the floor while the window remembers a recommendation as high":
        Row(obs(100, 140, floor=8), ("hold", "stabilization"), recs(100, 560)),
    "keeps the window's load across a fragment change: 4.9 GPUs are 14 half-GPU replicas":
        Row(obs(100, 140, floor=14, share=0.5), ("hold", "stabilization"), recs(100, 490)),
    "forgets recommendations older than the window and drops in one step, like the HPA":
        Row(obs(100, 140, floor=8), ("set", 2), recs(400, 560), cfg={"scale_down_margin": 0}),
    "drops in one step to the count the margin keeps (140 percent at 63: 3 replicas)":
        Row(obs(100, 140, floor=8), ("set", 3), recs(400, 560), cfg={"scale_down_margin": 0.1}),
    "removes at most max_step_down_gpus worth of replicas when that is set":
        Row(obs(100, 140, floor=8, share=0.5), ("set", 6), recs(400, 560), cfg={"max_step_down_gpus": 1}),
    "waits out the cooldown after a change":
        Row(obs(280, 490, floor=4), ("hold", "cooldown"), history(changed_ago=10, direction=1)),
    "takes no action without a forecast":
        Row(workload_obs(signal(None)), ("invalid", "no forecast")),
    "takes no action on stale data":
        Row(workload_obs(signal(280, 490, age=121)), ("invalid", "stale")),
    "takes no action on a non-finite forecast":
        Row(nan_load(), ("invalid", "not finite")),
    "takes no action when the source reported a problem":
        Row(workload_obs(signal(280, 490, problem="HTTP 503 from Prometheus")), ("invalid", "HTTP 503")),
    "takes no action when the current floor is unknown":
        Row(obs(280, 490, floor=None), ("invalid", "floor unknown")),
}  # fmt: skip


@pytest.mark.parametrize("row", ROWS.values(), ids=list(ROWS))
def test_replica_floor_rule(row: Row) -> None:
    cfg = ReplicasConfig.model_validate({**FORECAST_ONLY, **row.cfg})
    out = floor_of(row.obs, cfg, STALENESS, row.hist, NOW)
    assert_outcome(out, row.expect, "forecast upper")


def test_the_floor_sizes_for_the_observed_demand_when_it_is_above_the_forecast() -> None:
    obs = workload_obs(Signal(NOW - 1, forecast(100, 140, last=490)), floor=4)
    out = floor_of(obs, ReplicasConfig(), STALENESS, TargetHistory(), NOW)
    # 490 % of a GPU at 70 % a replica: 7 replicas, with or without the forecast's skill.
    assert_outcome(out, ("set", 7), "observed peak 490%")
    assert "skill fallback" in out.decision.reason  # type: ignore[union-attr]


def test_every_tick_remembers_its_recommendation_for_the_window() -> None:
    out = floor_of(
        workload_obs(signal(280, 490), floor=4),
        ReplicasConfig.model_validate(FORECAST_ONLY),
        STALENESS,
        history(recs=((400, 630), (100, 350))),
        NOW,
    )
    assert out.history.recommendations == ((NOW - 100, 350), (NOW, 490))


TOO_SHORT = "only 300s of samples in the window, forecast needs 600s"


NO_FORECAST = {
    "before the forecast has history the floor sizes for the observed demand":
        (Signal(NOW - 1, None, TOO_SHORT), 490.0, ("set", 7)),
    "a source problem (no observed peak) takes no action":
        (Signal(NOW - 1, None, "HTTP 503 from Prometheus"), None, ("invalid", "HTTP 503")),
    "stale samples take no action":
        (Signal(NOW - 200, None, TOO_SHORT), 490.0, ("invalid", TOO_SHORT)),
    "a non-finite observed peak takes no action":
        (Signal(NOW - 1, None, TOO_SHORT), float("nan"), ("invalid", TOO_SHORT)),
}  # fmt: skip


@pytest.mark.parametrize(("load", "peak", "expect"), NO_FORECAST.values(), ids=list(NO_FORECAST))
def test_without_a_forecast_only_the_observed_demand_sizes_the_floor(
    load: Signal, peak: float | None, expect: tuple[str, object]
) -> None:
    obs = replace(workload_obs(load, floor=4), recent_peak=peak)
    out = floor_of(obs, ReplicasConfig(), STALENESS, TargetHistory(), NOW)
    assert_outcome(out, expect, "no forecast")


def _floor_changes(margin: float) -> list[int]:
    """The floors set while a demand hovers at the 2-replica boundary: 10 minutes at
    160 % of a GPU (above 2 replicas' 140 % by more than the tolerance), 10 minutes at
    135 % (fits 2 replicas, not with a 10 % margin), four times over."""
    cfg = ReplicasConfig.model_validate({**FORECAST_ONLY, "scale_down_margin": margin})
    return _floors_set(cfg, ([160.0] * 20 + [135.0] * 20) * 4, floor=2)


def _floors_set(
    cfg: ReplicasConfig, loads: list[float], floor: int, share: float = 1.0
) -> list[int]:
    """The floors a replay of `loads` (one a 30 s tick, forecast = load) sets, each
    change applied before the next tick."""
    h, floors = TargetHistory(), []
    for tick, load in enumerate(loads):
        now = NOW + 30 * tick
        obs = workload_obs(Signal(now - 1, forecast(load, load)), floor=floor, share=share)
        out = floor_of(obs, cfg, STALENESS, h, now)
        h = out.history
        if out.decision is not None:
            floor = int(out.decision.to_value)
            floors.append(floor)
            h = replace(h, last_change_at=now, last_direction=out.decision.direction)
    return floors


def test_a_demand_hovering_at_a_replica_boundary_raises_the_floor_once_and_keeps_it() -> None:
    assert _floor_changes(0.1) == [3]
    # Without the margin (the HPA's rule) the floor flips with every swing: the same
    # demand costs eight changes.
    assert _floor_changes(0.0) == [3, 2] * 4


HELD = {
    "16 quarter-GPU replicas sized for their load hold 4 GPUs": (16, 0.25, None, 4.0),
    "7 half-GPU replicas hold 3.5 GPUs": (7, 0.5, None, 3.5),
    "a floor at min_replicas moves with the fragments: none counted": (1, 0.5, None, 0.0),
    "a floor at the object's own maximum: none counted": (6, 1.0, 6, 0.0),
    "a floor at max_replicas: none counted": (50, 1.0, None, 0.0),
    "an unknown floor: none counted": (None, 1.0, None, 0.0),
}


@pytest.mark.parametrize(
    ("floor", "share", "max_replicas", "expected"), HELD.values(), ids=list(HELD)
)
def test_the_gpus_a_floor_holds_count_only_what_its_load_sized(
    floor: int | None, share: float, max_replicas: int | None, expected: float
) -> None:
    obs = workload_obs(signal(100), floor=floor, max_replicas=max_replicas, share=share)
    assert floor_gpus(obs, ReplicasConfig(), floor) == expected


WHOLE = {
    "up to an odd count of half-GPU replicas fills the GPU": (7, 6, 0.5, 50, 8),
    "down one half-GPU replica frees no GPU: stays": (7, 8, 0.5, 50, 8),
    "down from 5 GPUs to 3": (6, 9, 0.5, 50, 6),
    "down to 2.5 GPUs fills the third": (5, 9, 0.5, 50, 6),
    "down to three quarter-GPU replicas fills the GPU": (3, 8, 0.25, 50, 4),
    "down one quarter-GPU replica frees no GPU: stays": (7, 8, 0.25, 50, 8),
    "never above the ceiling": (9, 4, 0.25, 10, 10),
    "whole-GPU replicas are left as they are": (3, 5, 1.0, 50, 3),
    "two-GPU replicas are left as they are": (3, 1, 2.0, 50, 3),
    "a share that does not divide a GPU packs floor(1 / share): 5 and 6 hold 2 GPUs": (5, 6, 0.3, 50, 6),
    "a share of 0.3 fills to 3 a GPU": (4, 1, 0.3, 50, 6),
    "from zero, the first GPU is filled": (1, 0, 0.5, 50, 2),
    "no change stays no change": (6, 6, 0.5, 50, 6),
}  # fmt: skip


@pytest.mark.parametrize(
    ("to", "current", "share", "ceiling", "expected"), WHOLE.values(), ids=list(WHOLE)
)
def test_the_floor_moves_in_whole_gpus(
    to: int, current: int, share: float, ceiling: int, expected: int
) -> None:
    assert whole_gpus(to, current, share, ceiling) == expected


def _descent(whole: bool) -> list[int]:
    """The floors set as a demand falls 10 % every 20 minutes from 300 % of a GPU, on
    half-GPU replicas (35 % each at the 70 % target): a diurnal evening."""
    cfg = ReplicasConfig.model_validate({**FORECAST_ONLY, "whole_gpus": whole})
    loads = [300.0 * 0.9 ** (tick // 40) for tick in range(40 * 12)]
    return _floors_set(cfg, loads, floor=9, share=0.5)


def test_a_falling_demand_on_half_gpu_replicas_steps_down_a_whole_gpu_at_a_time() -> None:
    # 300 % -> 94 % over 12 steps of 10 %: one half-GPU replica at a time without the rule.
    assert _descent(False) == [8, 7, 6, 5, 4, 3]
    # In whole GPUs: 5 -> 4 -> 3 -> 2 GPUs held, half the changes; 3 replicas would hold
    # the 2 GPUs 4 hold, so the floor ends at 4.
    assert _descent(True) == [8, 6, 4]
