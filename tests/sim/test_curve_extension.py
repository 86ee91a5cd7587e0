"""Baseline curves extended below 40 % where gpuscaler holds more GPU-hours than the
whole swept curve, or violates less, so the equal-cost figure is read at gpuscaler's own
cost and the equal-SLO figure at its own SLO outcome."""

from __future__ import annotations

from typing import Any

import pytest

from gpuscaler.config import Config
from gpuscaler.sim.equal_cost import equal_cost
from gpuscaler.sim.records import SimulationResult
from gpuscaler.sim.simulate import extend_below, simulate
from gpuscaler.sim.synthetic import synthetic_trace


@pytest.fixture(scope="module")
def one_hour() -> SimulationResult:
    trace = synthetic_trace("bursts", hours=1.0, seed=3)
    return simulate(trace, None, 1, Config(), baselines=False)


def cheap_curve(gpu_hours: float, share: float = 0.5) -> list[dict[str, Any]]:
    """A stand-in swept curve whose dearest point lies below `gpu_hours`."""
    return [
        {"target_pct": t, "gpu_hours": gpu_hours * t / 200, "slo_violation_share": share,
         "p99_wait_s": 9.0, "scaling_actions": 1}
        for t in range(40, 91, 5)
    ]  # fmt: skip


def test_a_curve_cheaper_than_gpuscaler_is_extended_down_until_it_reaches_its_gpu_hours(
    one_hour: SimulationResult,
) -> None:
    g = one_hour.summary()["gpuscaler"]["gpu_hours"]
    one_hour.baselines = {"reactive": cheap_curve(g)}
    added = extend_below(one_hour, lowest=10)
    curve = one_hour.baselines["reactive"]
    targets = added["reactive"]
    assert targets == list(range(35, targets[-1] - 1, -5)) and targets[-1] >= 10
    assert [p["target_pct"] for p in curve] == sorted(p["target_pct"] for p in curve)
    new = [p for p in curve if p["target_pct"] < 40]
    # Real runs: the lowest target holds the most GPU-hours, and reaches gpuscaler's own.
    assert new[0]["gpu_hours"] >= g or targets[-1] == 10
    if new[0]["gpu_hours"] >= g:
        assert equal_cost(curve, g) is not None
        assert max(p["gpu_hours"] for p in new[1:] + cheap_curve(g)) < g  # no step further


@pytest.mark.parametrize(
    ("scale", "lowest"),
    [(4.0, 10), (1e-3, 40)],  # it already reaches gpuscaler; nothing below 40 % allowed
)
def test_a_curve_that_reaches_gpuscaler_or_the_lowest_target_is_left_as_it_is(
    one_hour: SimulationResult, scale: float, lowest: int
) -> None:
    curve = cheap_curve(scale * one_hour.gpuscaler.metrics["gpu_hours"], share=0.0)
    one_hour.baselines = {"reactive": list(curve)}
    assert extend_below(one_hour, lowest=lowest) == {}
    assert one_hour.baselines["reactive"] == curve


def test_a_curve_that_never_violates_as_little_as_gpuscaler_is_extended_too(
    one_hour: SimulationResult,
) -> None:
    g = one_hour.gpuscaler.metrics
    worse = g["slo_violation_share"] + 0.2
    one_hour.baselines = {"reactive": cheap_curve(4.0 * g["gpu_hours"], share=worse)}
    targets = extend_below(one_hour, lowest=30)["reactive"]
    assert targets[0] == 35
    curve = {p["target_pct"]: p for p in one_hour.baselines["reactive"]}
    # A real run at the last target added violates no more than gpuscaler, or 30 % is the end.
    assert curve[targets[-1]]["slo_violation_share"] <= g["slo_violation_share"] or targets == [
        35,
        30,
    ]
    assert all(curve[t]["slo_violation_share"] > g["slo_violation_share"] for t in targets[:-1])
