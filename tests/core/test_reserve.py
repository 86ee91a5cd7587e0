"""The reserve for bursts reactive capacity cannot meet in time (`overflow_reserves`), and
the replica floor that keeps it."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
from builders import NOW, floor_of, workload_obs
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.config import ReplicasConfig
from gpuscaler.core.decisions import ReplicaFloorDecision
from gpuscaler.core.model import Signal, TargetHistory
from gpuscaler.core.replicas import Reserve, overflow_reserves

TICK = 30.0
WINDOW = 300.0
SPAN = 3600.0
AT_TARGET = 50.0
"""One replica serves 50 (% of a GPU) at target 50 %, 100 at full use."""
FULL = 100.0
NAN = float("nan")


def ticks(values: list[float], now: float = NOW) -> np.ndarray:
    """Tick records, one per 30 s, the last at `now`."""
    n = len(values)
    recs = [(now - TICK * (n - 1 - i), v, NAN, NAN) for i, v in enumerate(values)]
    return np.asarray(recs, dtype=np.float64).reshape(-1, 4)


def overflow_reserve(
    seen: np.ndarray, now: float, window: float, span: float, at_target: float, full: float
) -> Reserve | None:
    """The reserve of one workload's records: `overflow_reserves` of one row."""
    one = np.asarray([at_target]), np.asarray([full])
    return overflow_reserves(seen[None], now, window, span, *one)[0]


@dataclass
class Row:
    values: list[float]
    peak: float | None


BASE = [100.0] * 20
"""Two replicas at target; 200 at full use."""

ROWS = {
    "a burst past full use of the reactive sizing is reserved for": Row([*BASE, 450.0, *BASE], 450),
    "the highest of several bursts sets the reserve": Row([*BASE, 300, *BASE, 450, *BASE], 450),
    "a burst within the target's headroom needs no reserve": Row([*BASE, 190.0, *BASE], None),
    "a ramp never outruns its own headroom": Row([100.0 + 4 * i for i in range(100)], None),
    "a burst older than the span is forgotten": Row([*BASE, 450.0] + [100.0] * 130, None),
    "the first tick has nothing to be sized from": Row([450.0, *BASE], None),
    "missing values neither overflow nor size": Row([*BASE, NAN, *BASE], None),
    "no records, no reserve": Row([], None),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=list(ROWS))
def test_overflow_reserve(row: Row) -> None:
    r = overflow_reserve(ticks(row.values), NOW, WINDOW, SPAN, AT_TARGET, FULL)
    if row.peak is None:
        assert r is None
    else:
        assert r is not None and r.peak == row.peak and r.overflows >= 1


def test_the_reserve_is_judged_on_the_counterfactual_not_on_the_replicas_that_ran() -> None:
    """A second burst that the reserve served still counts: the records are demand, and
    each tick is checked against reactive sizing from the window before it alone."""
    values = [*BASE, 450.0, *([100.0] * 40), 450.0, *BASE]
    r = overflow_reserve(ticks(values), NOW, WINDOW, SPAN, AT_TARGET, FULL)
    assert r is not None and r.overflows == 2
    assert r.age == pytest.approx(TICK * len(BASE))


def test_the_floor_keeps_the_reserve_after_a_burst_and_says_why() -> None:
    cfg = ReplicasConfig(target_utilization_pct=50.0)
    load = Signal(NOW - 1, None, "too little history for a forecast")
    obs = replace(workload_obs(load, floor=2), recent_peak=100.0)
    burst = TargetHistory(seen=ticks([*BASE, 450.0, *([100.0] * 15)], NOW - TICK))
    out = floor_of(obs, cfg, 120.0, burst, NOW)
    assert isinstance(out.decision, ReplicaFloorDecision)
    assert out.decision.to_value == 5  # 450 at full use of 100 each
    assert "reserve 5 replicas" in out.decision.reason
    calm = TargetHistory(seen=ticks([100.0] * 36, NOW - TICK))
    out = floor_of(obs, cfg, 120.0, calm, NOW)
    assert out.decision is None and out.skip is not None
    assert "reserve" not in out.skip.reason


@pytest.mark.parametrize(
    ("reserve_window", "kept"),
    [("2h", True), ("1h", False), ("0s", False)],
    ids=["two hours keep a burst of 90 minutes ago", "one hour does not", "zero: no reserve"],
)
def test_the_reserve_lasts_the_reserve_window(reserve_window: str, kept: bool) -> None:
    cfg = ReplicasConfig(target_utilization_pct=50.0, reserve_window=reserve_window)
    load = Signal(NOW - 1, None, "too little history for a forecast")
    obs = replace(workload_obs(load, floor=2), recent_peak=100.0)
    minutes_90 = int(90 * 60 / TICK)
    seen = ticks([*BASE, 450.0, *([100.0] * (minutes_90 - 1))], NOW - TICK)
    out = floor_of(obs, cfg, 120.0, TargetHistory(seen=seen), NOW)
    if kept:
        assert isinstance(out.decision, ReplicaFloorDecision)
        assert out.decision.to_value == 5
        assert "in the last 7200s" in out.decision.reason
    else:
        assert out.decision is None and out.skip is not None
        assert "reserve" not in out.skip.reason


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 1e4), st.integers(2, 300))
def test_a_steady_demand_never_keeps_a_reserve(level: float, n: int) -> None:
    assert overflow_reserve(ticks([level] * n), NOW, WINDOW, SPAN, AT_TARGET, FULL) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1e4), min_size=2, max_size=300))
def test_a_reserve_is_the_highest_overflow_of_the_span(values: list[float]) -> None:
    r = overflow_reserve(ticks(values), NOW, WINDOW, SPAN, AT_TARGET, FULL)
    if r is not None:
        in_span = values[-int(SPAN / TICK) :]
        assert r.peak in in_span and r.peak > FULL
        assert 1 <= r.overflows <= len(in_span)
        assert 0 <= r.age < SPAN
