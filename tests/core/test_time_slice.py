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
    name: str
    obs: PoolObservation
    expect: tuple[str, object]
    hist: TargetHistory = field(default_factory=TargetHistory)
    pool: NodePoolConfig = field(default_factory=pool)


ROWS = [
    Row(
        "lengthens the slice when mean stall is above 15 percent",
        pool_obs(UTIL, stall=20, level="medium"),
        ("set", "long"),
    ),
    Row(
        "lengthens from the driver default too",
        pool_obs(UTIL, stall=16, level="default"),
        ("set", "short"),
    ),
    Row(
        "treats an unreported level as the driver default",
        pool_obs(UTIL, stall=16, level=None),
        ("set", "short"),
    ),
    Row(
        "stays at long however high the stall",
        pool_obs(UTIL, stall=40, level="long"),
        ("hold", "already long"),
    ),
    Row(
        "holds when stall is between the recovery and trigger thresholds",
        pool_obs(UTIL, stall=10, level="long"),
        ("hold", "stall 10.0%"),
    ),
    Row(
        "holds at exactly the trigger threshold",
        pool_obs(UTIL, stall=15, level="medium"),
        ("hold", "stall 15.0%"),
    ),
    Row(
        "starts the stabilization clock when stall first drops low",
        pool_obs(UTIL, stall=5, level="long"),
        ("hold", "low for 0s of 900s"),
    ),
    Row(
        "waits for the stabilization period before stepping back",
        pool_obs(UTIL, stall=5, level="long"),
        ("hold", "low for 600s"),
        history(calm_for=600),
    ),
    Row(
        "steps back toward the compute-bound base after stabilization",
        pool_obs(UTIL, stall=5, level="long"),
        ("set", "medium"),
        history(calm_for=900),
    ),
    Row(
        "steps up toward the base from the driver default after stabilization",
        pool_obs(UTIL, stall=5, level="default"),
        ("set", "short"),
        history(calm_for=900),
    ),
    Row(
        "uses the short base level for an IO-bound pool",
        pool_obs(UTIL, stall=5, level="medium"),
        ("set", "short"),
        history(calm_for=900),
        pool(profile="io_bound"),
    ),
    Row(
        "does nothing at the base level when stall is low",
        pool_obs(UTIL, stall=1, level="medium"),
        ("hold", "at level medium"),
    ),
    Row(
        "waits out the cooldown after a change",
        pool_obs(UTIL, stall=20, level="medium"),
        ("hold", "cooldown"),
        history(changed_ago=100, direction=1),
    ),
    Row(
        "takes no action when stall is unknown", pool_obs(UTIL, stall=None), ("invalid", "missing")
    ),
    Row(
        "takes no action when stall is NaN",
        pool_obs(UTIL, stall=float("nan")),
        ("invalid", "not finite"),
    ),
    Row(
        "takes no action when the stall series is stale",
        replace(pool_obs(UTIL, stall=20), stall_last_sample_time=NOW - 500),
        ("invalid", "stale"),
    ),
    Row(
        "takes no action on an unknown level",
        pool_obs(UTIL, stall=20, level="turbo"),
        ("invalid", "unknown time slice level"),
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_time_slice_rule(row: Row) -> None:
    out = decide_time_slice(row.obs, row.pool, TimeSliceConfig(), STALENESS, row.hist, NOW)
    assert_outcome(out, row.expect, "stall mean over 300s")


def test_a_stall_spike_restarts_the_stabilization_clock() -> None:
    out = decide_time_slice(
        pool_obs(UTIL, stall=12, level="long"),
        pool(),
        TimeSliceConfig(),
        STALENESS,
        history(calm_for=800),
        NOW,
    )
    assert out.history.calm_since is None
