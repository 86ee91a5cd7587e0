"""Fragments per GPU: one named row per rule and per edge case."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest
from builders import NOW, assert_outcome, history, pool, pool_obs, signal

from gpuscaler.config import FragmentsConfig, NodePoolConfig
from gpuscaler.core.fragments import decide_fragments, memory_limit
from gpuscaler.core.model import PoolObservation, Signal, TargetHistory

STALENESS = 120.0
DOWN = history(pending_for=60, pending_direction=-1)  # a trigger held 60 s
UP = history(pending_for=60, pending_direction=+1)


@dataclass
class Row:
    obs: PoolObservation
    expect: tuple[str, object]
    """("set", to) | ("hold", text in reason) | ("invalid", text in reason)"""
    hist: TargetHistory = field(default_factory=TargetHistory)
    cfg: dict[str, object] = field(default_factory=dict)
    pool: NodePoolConfig = field(default_factory=pool)
    floor_gpus: float = 0.0
    """GPUs the pool's replica floors hold sized for their load."""


def held4(peak: float, upper: float, gpus: int) -> PoolObservation:
    """A pool at 4 fragments whose pods hold `gpus` GPUs."""
    return replace(pool_obs(signal(peak, upper), fragments=4), gpus_held=gpus)


def nan_signal() -> Signal:
    s = signal(90, 95)
    assert s.forecast is not None
    s.forecast.mean[3] = np.nan
    return s


def obs(peak: float, upper: float, **kw: Any) -> PoolObservation:
    return pool_obs(signal(peak, upper), **kw)


ROWS = {
    "halves fragments when the forecast peak is above 85 percent":
        Row(obs(90, 95, fragments=4), ("set", 2), DOWN),
    "doubles fragments when the forecast upper bound is below 40 percent":
        Row(obs(20, 30, fragments=4), ("set", 8), UP),
    "doubles when the pool's demand fits the GPUs packing leaves (4 GPUs at 15 percent)":
        Row(held4(10, 15, 4), ("set", 8), UP),
    "does not double when the 2 GPUs packing leaves would hold 4 GPUs at 30 percent":
        Row(held4(20, 30, 4), ("hold", "the 2 GPUs 8 fragments leave"), UP),
    "does not double when one GPU holds the pool: more fragments would pack nothing":
        Row(held4(20, 30, 1), ("hold", "pack nothing"), UP),
    "does not double when the demand would not fit one GPU fewer (2 GPUs at 30 percent)":
        Row(held4(20, 30, 2), ("hold", "pack nothing"), UP),
    "does not double when the replica floor holds all 4 GPUs: it would double its replicas":
        Row(held4(10, 15, 4), ("hold", "the replica floor holds 4 of the 4 GPUs"), UP, floor_gpus=4.0),
    "counts a floor of 3.5 GPUs as the 4 GPUs its replicas fill":
        Row(held4(10, 15, 4), ("hold", "more fragments would pack nothing"), UP, floor_gpus=3.5),
    "doubles when the floor leaves a GPU to save (3 of 4) and the demand fits 3 GPUs":
        Row(held4(10, 15, 4), ("set", 8), UP, floor_gpus=3.0),
    "a floor above what packing leaves never lets through a packing the demand would not fit":
        Row(held4(20, 28, 4), ("hold", "would not fit the 2 GPUs"), UP, floor_gpus=3.0),
    "doubles when the floor holds fewer GPUs than packing leaves":
        Row(held4(10, 15, 4), ("set", 8), UP, floor_gpus=1.0),
    "halves whatever the floor holds: fewer fragments are not a packing":
        Row(held4(90, 95, 4), ("set", 2), DOWN, floor_gpus=4.0),
    "holds when the forecast sits between the thresholds":
        Row(obs(60, 70), ("hold", "within")),
    "does not double when only the mean is low but the upper bound is not":
        Row(obs(35, 45), ("hold", "within")),
    "waits when a trigger has not yet held for the sustain period":
        Row(obs(90, 95), ("hold", "wait"), history(pending_for=30, pending_direction=-1)),
    "starts the sustain clock on the first tick above the threshold":
        Row(obs(90, 95), ("hold", "for 0s of the 60s")),
    "acts at once when the sustain period is zero":
        Row(obs(90, 95), ("set", 2), cfg={"sustain": "0s"}),
    "waits out the cooldown after a change": Row(
        obs(90, 95), ("hold", "cooldown"),
        history(changed_ago=100, direction=-1, pending_for=60, pending_direction=-1)),
    "acts again once the cooldown has passed": Row(
        obs(90, 95, fragments=2), ("set", 1),
        history(changed_ago=601, direction=-1, pending_for=60, pending_direction=-1)),
    "needs the reversal margin to undo a doubling":
        Row(obs(87, 95), ("hold", "within [40%, 90%]"), history(changed_ago=900, direction=+1)),
    "undoes a doubling once the margin is passed": Row(
        obs(91, 95), ("set", 2),
        history(changed_ago=900, direction=+1, pending_for=60, pending_direction=-1)),
    "needs the reversal margin to undo a halving":
        Row(obs(30, 38), ("hold", "within [35%, 85%]"), history(changed_ago=900, direction=-1)),
    "never goes below the fewest allowed count":
        Row(obs(95, 99, fragments=1), ("hold", "already at fewest allowed"), DOWN),
    "never goes above the most allowed count":
        Row(obs(5, 10, fragments=8), ("hold", "most allowed"), UP),
    "keeps training fragments at 8 GiB or more": Row(
        obs(5, 10, fragments=2), ("hold", "memory bound"), UP,
        pool=pool(gpu_memory_gib=16, workload_type="training")),
    "allows training fragments that keep 8 GiB after reserve and over-commit":
        Row(obs(5, 10, fragments=2), ("set", 4), UP, pool=pool(gpu_memory_gib=24, workload_type="training")),
    "keeps inference fragments at 4 GiB or more": Row(
        obs(5, 10, fragments=4), ("hold", "below the 4 GiB inference floor"), UP,
        pool=pool(gpu_memory_gib=16)),
    "uses the GPU memory the cluster reports over the configured one":
        Row(obs(5, 10, fragments=4, gpu_memory_gib=16), ("hold", "memory bound"), UP),
    "never over-commits compute when stepping more than one doubling":
        Row(obs(25, 30, fragments=2), ("set", 4), UP, cfg={"max_step": 2}),
    "quadruples in one step when memory and compute allow it":
        Row(obs(5, 10, fragments=2), ("set", 8), UP, cfg={"max_step": 2}),
    "never shrinks fragments below the memory tenants already use": Row(
        obs(5, 10, fragments=2, memory_used_gib=60), ("hold", "memory in use: tenants hold 30.0 GiB each"),
        UP),
    "stops doubling where the memory tenants use would no longer fit":
        Row(obs(5, 10, fragments=2, memory_used_gib=30), ("set", 4), UP, cfg={"max_step": 2}),
    "never lowers fragments below the shares pods hold":
        Row(obs(90, 95, fragments=4, held=3), ("hold", "needs preemption first"), DOWN),
    "takes no action without a forecast":
        Row(pool_obs(signal(None)), ("invalid", "no forecast")),
    "takes no action on stale data":
        Row(pool_obs(signal(90, 95, age=300)), ("invalid", "stale")),
    "takes no action on a NaN forecast":
        Row(pool_obs(nan_signal()), ("invalid", "not finite")),
    "takes no action when the source reported a problem": Row(
        pool_obs(signal(90, 95, problem="Prometheus unreachable")), ("invalid", "Prometheus unreachable")),
    "takes no action when current fragments are unknown":
        Row(obs(90, 95, fragments=None), ("invalid", "unknown")),
    "takes no action when current fragments are not an allowed count":
        Row(obs(90, 95, fragments=3), ("invalid", "not in allowed")),
}  # fmt: skip


@pytest.mark.parametrize("row", ROWS.values(), ids=list(ROWS))
def test_fragment_rule(row: Row) -> None:
    cfg = FragmentsConfig.model_validate(row.cfg)
    out = decide_fragments(row.obs, row.pool, cfg, STALENESS, row.hist, NOW, row.floor_gpus)
    assert_outcome(out, row.expect, "fragments")
    if out.decision is not None:
        assert out.decision.from_value == row.obs.fragments


def test_a_decision_reason_names_forecast_threshold_and_bound() -> None:
    obs = pool_obs(signal(5, 10), fragments=2)
    training = pool(gpu_memory_gib=24, workload_type="training")
    out = decide_fragments(obs, training, FragmentsConfig(), STALENESS, UP, NOW)
    assert out.decision is not None
    reason = out.decision.reason
    assert "upper bound 10.0% < 40%" in reason
    assert "memory bound" in reason


def test_a_value_hovering_at_the_threshold_never_changes_fragments() -> None:
    cfg = FragmentsConfig.model_validate({"sustain": "1m"})
    h = TargetHistory()
    decisions = 0
    for tick in range(200):
        peak = 86.0 if tick % 2 else 84.0  # crosses 85 % every other 30 s tick
        now = NOW + 30 * tick
        obs = pool_obs(signal(peak, peak + 3), fragments=4)
        obs = PoolObservation(
            **{**obs.__dict__, "utilization": Signal(now - 1, obs.utilization.forecast)}
        )
        out = decide_fragments(obs, pool(), cfg, STALENESS, h, now)
        h = out.history
        decisions += out.decision is not None
    assert decisions == 0


def test_invalid_input_clears_a_pending_trigger() -> None:
    out = decide_fragments(
        pool_obs(signal(90, 95, age=999)), pool(), FragmentsConfig(), STALENESS, DOWN, NOW
    )
    assert out.history.pending_since is None


@pytest.mark.parametrize(
    ("gib", "kind", "expected"),
    [
        (80, "inference", 27),
        (80, "training", 13),
        (16, "training", 2),
        (24, "training", 4),
        (16, "inference", 5),
    ],
)
def test_memory_limit_counts_reserve_and_overcommit(gib: float, kind: str, expected: int) -> None:
    cfg = FragmentsConfig()
    assert memory_limit(gib, cfg.min_fragment_memory_gib[kind], cfg) == expected  # type: ignore[index]


def test_the_decision_goes_both_ways_as_demand_per_gpu_falls_and_rises_again() -> None:
    # Four replicas serving a demand of 3.6 GPUs that falls to 0.5 and comes back: fragments
    # double when the demand fits the GPUs packing leaves, and halve again when it returns.
    cfg = FragmentsConfig()
    h, fragments, steps = TargetHistory(), 1, []
    demand = [3.6] * 10 + list(np.linspace(3.6, 0.5, 20)) + [0.5] * 40 + [3.6] * 40
    for tick, gpus_demand in enumerate(demand):
        now = NOW + 30 * tick
        held = -(-4 // fragments)
        per_gpu = 100 * gpus_demand / held
        obs = replace(
            pool_obs(Signal(now - 1, signal(per_gpu, per_gpu + 5).forecast), fragments=fragments),
            gpus_held=held,
        )
        out = decide_fragments(obs, pool(), cfg, STALENESS, h, now)
        h = out.history
        if out.decision is not None:
            steps.append((fragments, int(out.decision.to_value)))
            fragments = int(out.decision.to_value)
            h = replace(h, last_change_at=now, last_direction=out.decision.direction)
            h = replace(h, pending_since=None, pending_direction=0)
    assert steps == [(1, 2), (2, 1)], steps
