"""Workloads replayed in lockstep through one controller give, workload for workload, the
figures and decisions of each replayed alone (gpuscaler.sim.lockstep): the lanes are
independent runs of one model."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from gpuscaler.config import Config, WorkloadConfig, parse_config
from gpuscaler.core.decisions import FragmentsDecision, ReplicaFloorDecision
from gpuscaler.core.history import Signal, WorkloadHistory
from gpuscaler.core.model import Series
from gpuscaler.sim.lockstep import (
    PROGRESS_TICKS,
    ClusterPorts,
    LockstepError,
    combined_config,
    lane_clusters,
    lockstep_runs,
    place,
)
from gpuscaler.sim.replay import Skipped, WorkloadReplay, replay_many, workload_config
from gpuscaler.sim.simulate import Prepared, RunResult, prepare, run_figures
from gpuscaler.sim.trace import Trace, load_trace

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


def _trace(i: int) -> Trace:
    """Workload i's demand: the bundled week shifted by i x 5 h and scaled."""
    base = load_trace()
    shift = round(i * 5 * 3600 / base.bin_seconds)
    scale = (1.0, 0.6, 1.7, 0.02)[i]
    return Trace(f"w{i}", base.start, base.bin_seconds, np.roll(base.counts, -shift) * scale)


def _prepared(config: Config, hours: float = HOURS) -> list[Prepared]:
    return [
        prepare(_trace(i), hours, 7, workload_config(config, w, 10.0), START)
        for i, w in enumerate(config.workloads)
    ]


def _outcome(p: Prepared, run: RunResult) -> tuple[str, list[dict[str, Any]]]:
    """The run's figures, and its decisions without the forecast's figures (compared
    apart, within a tolerance: a batch sums in another order than a lane alone)."""
    figures = run_figures(p.config, p.start, p.scored_from, run)
    decisions = [{k: v for k, v in d.as_record().items() if k != "forecast"} for d in run.decisions]
    return json.dumps(figures, sort_keys=True), decisions


def _forecast_figures(run: RunResult) -> list[float]:
    """Every decision's forecast figures, in order."""
    out = []
    for d in run.decisions:
        figures = d.as_record().get("forecast")
        if isinstance(figures, dict):
            out += [float(v) for v in figures.values()]
    return out


@pytest.fixture(scope="module")
def runs() -> tuple[list[Prepared], list[RunResult], list[RunResult]]:
    preps = _prepared(parse_config(CONFIG))
    return preps, [lockstep_runs([p])[0] for p in preps], lockstep_runs(preps)


def test_each_lane_gives_the_figures_and_decisions_of_its_workload_replayed_alone(
    runs: tuple[list[Prepared], list[RunResult], list[RunResult]],
) -> None:
    preps, alone, together = runs
    for p, a, b in zip(preps, alone, together, strict=True):
        assert _outcome(p, b) == _outcome(p, a), p.trace
        np.testing.assert_allclose(_forecast_figures(b), _forecast_figures(a), rtol=1e-9)
        np.testing.assert_allclose(b.track.mean, a.track.mean, rtol=1e-9, atol=1e-9)
        assert b.track.origin == a.track.origin


def test_the_lanes_act_differently_so_the_equality_is_not_trivial(
    runs: tuple[list[Prepared], list[RunResult], list[RunResult]],
) -> None:
    _, alone, _ = runs
    floors = [
        [d.to_value for d in r.decisions if isinstance(d, ReplicaFloorDecision)] for r in alone
    ]
    assert all(floors[:3]), "the busy workloads set floors"
    assert len({tuple(f) for f in floors}) == len(floors)


def test_lane_decisions_name_the_configured_pool_not_the_lanes_copy(
    runs: tuple[list[Prepared], list[RunResult], list[RunResult]],
) -> None:
    preps, _, together = runs
    for p, run in zip(preps, together, strict=True):
        pool = p.config.workloads[0].node_pool
        for d in run.decisions:
            if isinstance(d, FragmentsDecision):
                assert d.target == pool
            assert "-lane" not in d.target


def test_two_workloads_on_one_pool_each_get_their_own_copy_of_it() -> None:
    config = parse_config(CONFIG)
    config = config.model_copy(
        update={
            "node_pools": (
                config.node_pools[0].model_copy(
                    update={"overrides": {"fragments": {"fewer_above_pct": 80.0}}}
                ),
                *config.node_pools[1:],
            )
        }
    )
    preps = _prepared(config, hours=1.0)
    lanes = [place(i, p, len(preps)) for i, p in enumerate(preps)]
    combined = combined_config(preps, lanes)
    names = [p.name for p in combined.node_pools]
    assert names == ["a100-80gb-lane0", "a100-80gb-lane1", "h100-lane2", "a100-80gb-lane3"]
    assert [w.node_pool for w in combined.workloads] == names
    shared = {p.name: p.overrides for p in combined.node_pools}
    assert shared["a100-80gb-lane0"] == shared["a100-80gb-lane1"] == config.node_pools[0].overrides
    ports = ClusterPorts(lane_clusters(preps), lanes)
    ports.advance_to(preps[0].start + 600.0)
    observed = ports.observe(preps[0].start + 600.0)
    assert [p.name for p in observed.pools] == names
    assert [w.key for w in observed.workloads] == [w.key for w in config.workloads]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"seed": 8}, "differs"),
        ({"start": 0.0}, "differs"),
        ({"seconds": 1800.0}, "differs"),
    ],
)
def test_replays_that_cannot_share_a_controller_are_refused(
    change: dict[str, Any], why: str
) -> None:
    preps = _prepared(parse_config(CONFIG), hours=1.0)[:2]
    fields = {k: getattr(preps[1], k) for k in Prepared.__dataclass_fields__}
    with pytest.raises(LockstepError, match=why):
        lockstep_runs([preps[0], Prepared(**{**fields, **change})])


def test_a_config_that_differs_beyond_workloads_and_pools_is_refused() -> None:
    config = parse_config(CONFIG)
    preps = _prepared(config, hours=1.0)[:2]
    other = config.model_copy(
        update={"control": config.control.model_copy(update={"interval": 60.0})}
    )
    p = prepare(_trace(1), 1.0, 7, workload_config(other, config.workloads[1], 10.0), START)
    with pytest.raises(LockstepError, match="differs"):
        lockstep_runs([preps[0], p])


def test_a_synthetic_preemption_burst_is_refused() -> None:
    config = parse_config(CONFIG)
    w = config.workloads[0]
    cfg = workload_config(config, w, 10.0)
    cfg = cfg.model_copy(
        update={"simulator": cfg.simulator.model_copy(update={"preemption_burst_after": 600.0})}
    )
    p = prepare(_trace(0), 1.0, 7, cfg, START)
    with pytest.raises(LockstepError, match="preemption"):
        lockstep_runs([p, p])


def _history(key: str, rate: np.ndarray, start: float = 1000.0) -> WorkloadHistory:
    return WorkloadHistory(
        key,
        start,
        start + 10.0 * (len(rate) - 1),
        10.0,
        Signal("workload_requests", "q_req", Series(start, 10.0, rate)),
        Signal("workload_load", "q_load", None),
        Signal("kube_horizontalpodautoscaler_status_current_replicas", "q_rep", None),
    )


def test_replay_many_in_lockstep_gives_each_alone_and_keeps_skips_in_order() -> None:
    config = parse_config(CONFIG)
    rng = np.random.default_rng(3)
    n = 360 + 3  # an hour at 10 s, one step of margin each side
    workloads: list[WorkloadConfig] = list(config.workloads)
    rates = [rng.uniform(5, 60, n) * (1 + np.sin(np.arange(n) / (40 + 9 * i))) for i in range(4)]
    rates[2] = np.repeat(rates[2][::30], 30)[:n]  # downsampled: skipped
    histories = [(_history(w.key, r), w) for w, r in zip(workloads, rates, strict=True)]

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
