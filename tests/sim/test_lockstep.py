"""Workloads replayed in lockstep through one controller give, workload for workload, the
figures and decisions of each replayed alone (gpuscaler.sim.lockstep): the lanes are
independent runs of one model."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from builders import shifted_week, workload_history

from gpuscaler.config import Config, WorkloadConfig, parse_config
from gpuscaler.core.decisions import ReplicaFloorDecision
from gpuscaler.core.model import Series
from gpuscaler.sim.lockstep import PROGRESS_TICKS, lane_ports, lockstep_runs
from gpuscaler.sim.records import RunResult
from gpuscaler.sim.replay import ModelError, Prepared, prepare
from gpuscaler.whatif.history import Skipped, WorkloadReplay, replay_many, workload_config

CONFIG = """
simulator: {preemption_burst_after: null, slot: 10s, gpu_seconds_per_request: 0.25}
node_pools:
  - {name: a100-80gb, selector: {label: nvidia.com/gpu.product, value: A100},
     gpu_memory_gib: 80, workload_type: inference, profile: compute_bound,
     initial_fragments: 2}
  - {name: h100, selector: {label: nvidia.com/gpu.product, value: H100},
     gpu_memory_gib: 80, workload_type: inference, profile: io_bound,
     initial_fragments: 4}
workloads:
  - {namespace: a, kind: ScaledObject, name: chat, node_pool: a100-80gb,
     overrides: {replicas: {max_replicas: 200}}}
  - {namespace: b, kind: ScaledObject, name: code, node_pool: a100-80gb,
     overrides: {replicas: {max_replicas: 200, target_utilization_pct: 60}}}
  - {namespace: c, kind: HorizontalPodAutoscaler, name: batch, node_pool: h100}
  - {namespace: d, kind: ScaledObject, name: idle, node_pool: a100-80gb}
"""
HOURS = 1.25
START = 3 * 24 + 12.0
"""Day 4 at noon of the bundled week: busy hours, the forecast and the floor at work."""

pytestmark = pytest.mark.timeout(600)


def _prepared(config: Config, hours: float = HOURS) -> list[Prepared]:
    """Each workload's replay of the bundled week, shifted and scaled."""
    scales = (1.0, 0.6, 1.7, 0.02)
    return [
        prepare(shifted_week(i, scales[i]), hours, 7, workload_config(config, w, 10.0), START)
        for i, w in enumerate(config.workloads)
    ]


def _outcome(run: RunResult) -> tuple[str, list[dict[str, Any]], list[float]]:
    """The run's figures, its decisions, and apart their forecast figures (compared within a
    tolerance: a batch sums in another order than a lane alone)."""
    records = [d.as_record() for d in run.decisions]
    decisions = [{k: v for k, v in r.items() if k != "forecast"} for r in records]
    forecasts = [r["forecast"] for r in records if isinstance(r["forecast"], dict)]
    figures = [float(v) for f in forecasts for v in f.values()]
    return json.dumps(run.metrics, sort_keys=True), decisions, figures


@pytest.fixture(scope="module")
def runs() -> tuple[list[Prepared], list[RunResult], list[RunResult]]:
    preps = _prepared(parse_config(CONFIG))
    return preps, [lockstep_runs([p])[0] for p in preps], lockstep_runs(preps)


def test_each_lane_gives_the_figures_and_decisions_of_its_workload_replayed_alone(
    runs: tuple[list[Prepared], list[RunResult], list[RunResult]],
) -> None:
    preps, alone, together = runs
    for p, a, b in zip(preps, alone, together, strict=True):
        got, want = _outcome(b), _outcome(a)
        assert got[:2] == want[:2], p.trace
        assert all("-lane" not in d.target for d in b.decisions)  # the configured pool's name
        np.testing.assert_allclose(got[2], want[2], rtol=1e-9)
        assert a.plotted is not None and b.plotted is not None
        assert a.plotted.band is not None and b.plotted.band is not None
        for x, y in zip(b.plotted.band, a.plotted.band, strict=True):  # the forecasts' band
            np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-9)


def test_the_lanes_act_differently_so_the_equality_is_not_trivial(
    runs: tuple[list[Prepared], list[RunResult], list[RunResult]],
) -> None:
    _, alone, _ = runs
    floors = [
        [d.to_value for d in r.decisions if isinstance(d, ReplicaFloorDecision)] for r in alone
    ]
    assert all(floors[:3]), "the busy workloads set floors"
    assert len({tuple(f) for f in floors}) == len(floors)


def test_two_workloads_on_one_pool_each_get_their_own_copy_of_it() -> None:
    config = parse_config(CONFIG)
    first = config.node_pools[0]
    first = first.model_copy(update={"overrides": {"fragments": {"fewer_above_pct": 80.0}}})
    config = config.model_copy(update={"node_pools": (first, *config.node_pools[1:])})
    preps = _prepared(config, hours=1.0)
    combined, ports = lane_ports(preps)
    names = [p.name for p in combined.node_pools]
    assert names == ["a100-80gb-lane0", "a100-80gb-lane1", "h100-lane2", "a100-80gb-lane3"]
    assert [w.node_pool for w in combined.workloads] == names
    shared = {p.name: p.overrides for p in combined.node_pools}
    assert shared["a100-80gb-lane0"] == shared["a100-80gb-lane1"] == config.node_pools[0].overrides
    ports.advance_to(preps[0].start + 600.0)
    observed = ports.observe(preps[0].start + 600.0)
    assert [p.name for p in observed.pools] == names
    assert [w.key for w in observed.workloads] == [w.key for w in config.workloads]


def _other_interval(config: Config) -> Config:
    control = config.control.model_copy(update={"interval": 60.0})
    return config.model_copy(update={"control": control})


def _burst(config: Config) -> Config:
    sim = config.simulator.model_copy(update={"preemption_burst_after": 600.0})
    return config.model_copy(update={"simulator": sim})


@pytest.mark.parametrize(
    ("second", "why"),
    [
        (lambda p, _: replace(p, seed=8), "differs"),
        (lambda p, _: replace(p, start=0.0), "differs"),
        (lambda p, _: replace(p, seconds=1800.0), "differs"),
        (lambda p, c: replace(p, config=_other_interval(p.config)), "differs"),
        (lambda p, c: replace(c, config=_burst(c.config)), "preemption"),
    ],
)
def test_replays_that_cannot_share_a_controller_are_refused(
    second: Callable[[Prepared, Prepared], Prepared], why: str
) -> None:
    first, other = _prepared(parse_config(CONFIG), hours=1.0)[:2]
    other = second(other, first)
    with pytest.raises(ModelError, match=why):
        lockstep_runs([other if why == "preemption" else first, other])


def test_replay_many_in_lockstep_gives_each_alone_and_keeps_skips_in_order() -> None:
    config = parse_config(CONFIG)
    rng = np.random.default_rng(3)
    n = 360 + 3  # an hour at 10 s, one step of margin each side
    workloads: list[WorkloadConfig] = list(config.workloads)
    rates = [rng.uniform(5, 60, n) * (1 + np.sin(np.arange(n) / (40 + 9 * i))) for i in range(4)]
    rates[2] = np.repeat(rates[2][::30], 30)[:n]  # downsampled: skipped
    histories = [
        (workload_history(w.key, n, Series(1000.0, 10.0, r)), w)
        for w, r in zip(workloads, rates, strict=True)
    ]

    def figures(lanes: int) -> list[str]:
        out = []
        for done in replay_many(histories, config, 1, baselines=False, lanes=lanes):
            if isinstance(done, Skipped):
                out.append(f"skipped {done.key}")
            else:
                assert isinstance(done, WorkloadReplay)
                out.append(json.dumps(done.summary(), sort_keys=True, default=str))
        return out

    alone, together, pairs = figures(1), figures(4), figures(2)
    assert alone == together == pairs
    assert alone[2] == f"skipped {workloads[2].key}"
    assert all(not s.startswith("skipped") for i, s in enumerate(alone) if i != 2)


def test_a_lockstep_reports_its_share_of_ticks_done_every_hour_and_at_the_end() -> None:
    preps = _prepared(parse_config(CONFIG))[:2]
    shares: list[float] = []
    lockstep_runs(preps, shares.append)
    ticks = round(HOURS * 3600 / 30)  # 150 ticks of 30 s: one report after 120, one at the end
    assert shares == [PROGRESS_TICKS / ticks, 1.0]
