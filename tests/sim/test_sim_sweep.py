"""The runs without a controller (`gpuscaler.sim.sweep`): the baselines swept over their
targets, the reactive HPA and the replicas that ran, many runs of one model stepped
together. A run's figures do not depend on the runs beside it or on how they are grouped."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from builders import shifted_week

from gpuscaler.config import parse_config
from gpuscaler.core.model import Series
from gpuscaler.sim.cluster import scenario_run
from gpuscaler.sim.equal_cost import BASELINES, sweep_targets
from gpuscaler.sim.replay import ModelError, Prepared, prepare
from gpuscaler.sim.sweep import Swept, around_many, baseline_curves, sweep_views

CONFIG = """
simulator: {preemption_burst_after: null, slot: 10s, gpu_seconds_per_request: 0.25}
node_pools:
  - {name: a100-80gb, selector: {label: nvidia.com/gpu.product, value: A100},
     gpu_memory_gib: 80, workload_type: inference, profile: compute_bound,
     initial_fragments: 2}
workloads:
  - {namespace: a, kind: ScaledObject, name: chat, node_pool: a100-80gb,
     overrides: {replicas: {max_replicas: 200}}}
"""
START = 3 * 24 + 10.0
"""Day 4 at 10:00 of the bundled week: demand rising towards its noon peak."""

pytestmark = pytest.mark.timeout(600)


def _prepared(i: int, hours: float = 1.5, seed: int = 7) -> Prepared:
    """Workload i's replay of the bundled week, shifted and scaled."""
    trace = shifted_week(i, (1.0, 0.5, 1.6)[i])
    return prepare(trace, hours, seed, parse_config(CONFIG), START)


def _json(x: Any) -> str:
    return json.dumps(x, sort_keys=True)


@pytest.fixture(scope="module")
def three() -> tuple[list[Prepared], list[Any]]:
    preps = [_prepared(i) for i in range(3)]
    return preps, around_many(preps)


def test_every_baseline_is_swept_over_every_target_a_lower_one_holding_more_gpu_hours(
    three: tuple[list[Prepared], list[Any]],
) -> None:
    _, arounds = three
    for a in arounds:
        assert set(a.curves) == set(BASELINES)
        for curve in a.curves.values():
            assert [p["target_pct"] for p in curve] == sweep_targets()
            assert curve[0]["gpu_hours"] > curve[-1]["gpu_hours"]


def test_the_reactive_run_is_the_reactive_baseline_at_the_workloads_target(
    three: tuple[list[Prepared], list[Any]],
) -> None:
    preps, arounds = three
    assert scenario_run(preps[0].config).target_pct == 70
    for a in arounds:
        point = next(x for x in a.curves["reactive"] if x["target_pct"] == 70)
        for key in ("gpu_hours", "slo_violation_share", "p99_wait_s", "scaling_actions"):
            assert a.reactive.metrics[key] == point[key], key


def test_each_workloads_curves_are_those_of_its_own_sweep(
    three: tuple[list[Prepared], list[Any]],
) -> None:
    preps, arounds = three
    assert _json(baseline_curves(preps[1])) == _json(arounds[1].curves)


def test_replays_of_another_model_are_refused() -> None:
    preps = [_prepared(0, hours=1.0), _prepared(1, hours=1.0, seed=8)]
    with pytest.raises(ModelError, match="differs"):
        around_many(preps, reactive=False)
    with pytest.raises(ModelError, match="differs"):
        sweep_views(preps, [Swept("a", 0, "hpa_util", 70.0), Swept("b", 1, "hpa_util", 70.0)])


def test_the_replicas_that_ran_are_set_at_each_tick_whatever_the_load() -> None:
    p = _prepared(0, hours=1.0)
    ticks = np.arange(p.start, p.start + p.seconds + 1, 30.0)
    counts = np.where(np.arange(len(ticks)) < 60, 3, 9)
    replicas = Series(p.start, 30.0, counts.astype(np.float64))
    [a] = around_many([p], [replicas], baselines=(), reactive=False)
    assert a.actual is not None
    assert a.actual["scaling_actions"] <= 1  # at most the 3 -> 9 step inside the scored part
    assert 3 < a.actual["mean_replicas"] < 9


def test_a_run_finished_without_its_plot_keeps_the_same_figures() -> None:
    p = _prepared(2, hours=1.0)
    [drawn] = around_many([p], baselines=())
    [bare] = around_many([p], baselines=(), plot=False)
    assert drawn.reactive is not None and bare.reactive is not None
    assert drawn.reactive.plotted is not None and bare.reactive.plotted is None
    assert drawn.reactive.metrics == bare.reactive.metrics
    assert (bare.reactive.slot, bare.reactive.cursor) == (10.0, 360)
