"""Time slice level: stall over 5 min above 15 % lengthens it; one row per rule."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from builders import NOW, assert_outcome, history, pool, pool_obs, signal

from gpuscaler.config import NodePoolConfig, TimeSliceConfig
from gpuscaler.core.model import PoolObservation, TargetHistory
from gpuscaler.core.time_slice import decide_time_slice

STALENESS = 120.0
UTIL = signal(60, 70)


@dataclass
class Row:
    obs: PoolObservation
    expect: tuple[str, object]
    hist: TargetHistory = field(default_factory=TargetHistory)
    pool: NodePoolConfig = field(default_factory=pool)


ROWS = {
    "lengthens the slice when mean stall is above 15 percent":
        Row(pool_obs(UTIL, stall=20, level="medium"), ("set", "long")),
    "lengthens from the driver default too":
        Row(pool_obs(UTIL, stall=16, level="default"), ("set", "short")),
    "treats an unreported level as the driver default":
        Row(pool_obs(UTIL, stall=16, level=None), ("set", "short")),
    "stays at long however high the stall":
        Row(pool_obs(UTIL, stall=40, level="long"), ("hold", "already long")),
    "holds when stall is between the recovery and trigger thresholds":
        Row(pool_obs(UTIL, stall=10, level="long"), ("hold", "stall 10.0%")),
    "holds at exactly the trigger threshold":
        Row(pool_obs(UTIL, stall=15, level="medium"), ("hold", "stall 15.0%")),
    "starts the stabilization clock when stall first drops low":
        Row(pool_obs(UTIL, stall=5, level="long"), ("hold", "low for 0s of 900s")),
    "waits for the stabilization period before stepping back":
        Row(pool_obs(UTIL, stall=5, level="long"), ("hold", "low for 600s"), history(calm_for=600)),
    "steps back toward the compute-bound base after stabilization":
        Row(pool_obs(UTIL, stall=5, level="long"), ("set", "medium"), history(calm_for=900)),
    "steps up toward the base from the driver default after stabilization":
        Row(pool_obs(UTIL, stall=5, level="default"), ("set", "short"), history(calm_for=900)),
    "uses the short base level for an IO-bound pool": Row(
        pool_obs(UTIL, stall=5, level="medium"), ("set", "short"), history(calm_for=900),
        pool(profile="io_bound")),
    "does nothing at the base level when stall is low":
        Row(pool_obs(UTIL, stall=1, level="medium"), ("hold", "at level medium")),
    "waits out the cooldown after a change": Row(
        pool_obs(UTIL, stall=20, level="medium"), ("hold", "cooldown"),
        history(changed_ago=100, direction=1)),
    "takes no action when stall is unknown":
        Row(pool_obs(UTIL, stall=None), ("invalid", "missing")),
    "takes no action when stall is NaN":
        Row(pool_obs(UTIL, stall=float("nan")), ("invalid", "not finite")),
    "takes no action when the stall series is stale":
        Row(replace(pool_obs(UTIL, stall=20), stall_last_sample_time=NOW - 500), ("invalid", "stale")),
    "takes no action on an unknown level":
        Row(pool_obs(UTIL, stall=20, level="turbo"), ("invalid", "unknown time slice level")),
}  # fmt: skip


@pytest.mark.parametrize("row", ROWS.values(), ids=list(ROWS))
def test_time_slice_rule(row: Row) -> None:
    out = decide_time_slice(row.obs, row.pool, TimeSliceConfig(), STALENESS, row.hist, NOW)
    assert_outcome(out, row.expect, "stall mean over 300s")


def test_a_stall_spike_restarts_the_stabilization_clock() -> None:
    spike = pool_obs(UTIL, stall=12, level="long")
    out = decide_time_slice(spike, pool(), TimeSliceConfig(), STALENESS, history(calm_for=800), NOW)
    assert out.history.calm_since is None
