"""The simulated cluster's model (`gpuscaler.sim.cluster.Clusters`): one model for one run
or many, its state arrays with a run axis. Properties of the model (work conserved, pods
counted as their times say, replicas within bounds) and of the run axis (a run's outcome
does not depend on the runs beside it)."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.config import Config, parse_config
from gpuscaler.core.decisions import FragmentsDecision, ReplicaFloorDecision
from gpuscaler.sim.cluster import Clusters, RunSpec, scenario_run
from gpuscaler.sim.load import arrivals_from_trace
from gpuscaler.sim.pods import Pods
from gpuscaler.sim.replay import scenario_config
from gpuscaler.sim.trace import Trace

CONFIG = """
simulator: {preemption_burst_after: null, gpu_seconds_per_request: 0.25, noise_pct: 3.0}
node_pools:
  - {name: a100-80gb, selector: {label: nvidia.com/gpu.product, value: A100},
     gpu_memory_gib: 80, workload_type: inference, profile: compute_bound,
     initial_fragments: 2}
workloads:
  - {namespace: serving, kind: ScaledObject, name: llm-chat, node_pool: a100-80gb,
     overrides: {replicas: {max_replicas: 200}}}
"""


def _config(**simulator: Any) -> Config:
    config = scenario_config(parse_config(CONFIG))
    if simulator:
        sim = config.simulator.model_copy(update=simulator)
        config = config.model_copy(update={"simulator": sim})
    return config


def _arrivals(config: Config, seconds: float, rate: float, seed: int = 1) -> np.ndarray:
    """Requests a slot of a trace whose rate swings around `rate` per second."""
    bins = int(seconds // 10) + 2
    wave = rate * (1.0 + 0.8 * np.sin(np.arange(bins) / 30.0))
    trace = Trace("wave", 0.0, 10.0, wave * 10.0)
    return arrivals_from_trace(trace, 0.0, seconds, seed, config.simulator.slot)


def _run(config: Config, arrivals: np.ndarray, specs: list[RunSpec], seconds: float) -> Clusters:
    """The runs of `specs` under their HPAs alone, every control interval."""
    clusters = Clusters(config, arrivals, 0.0, 1, specs)
    t = config.control.interval
    while t <= seconds:
        clusters.advance_to(t)
        clusters.hpa_step(t)
        t += config.control.interval
    clusters.advance_to(seconds)
    return clusters


@pytest.mark.parametrize("slot", [0.5, 10.0])
def test_work_is_served_or_still_queued_never_lost(slot: float) -> None:
    config = _config(slot=slot)
    arrivals = _arrivals(config, 3600.0, 40.0)
    specs = [scenario_run(config, target_pct=t) for t in (40.0, 70.0, 95.0)]
    clusters = _run(config, arrivals, specs, 3600.0)
    work = float(arrivals.sum()) * config.simulator.gpu_seconds_per_request
    np.testing.assert_allclose(clusters.waits.done + clusters.q, work, rtol=1e-9)


def test_a_lower_target_holds_more_gpus_and_replicas_rise_within_bounds_at_most_2x_or_4() -> None:
    config = _config(slot=10.0)
    arrivals = _arrivals(config, 4 * 3600.0, 90.0)
    specs = [scenario_run(config, target_pct=t, recorded=True) for t in (40.0, 60.0, 90.0)]
    clusters = _run(config, arrivals, specs, 4 * 3600.0)
    views = clusters.views()
    gpus = [v.gpu_slots for v in views]
    capacity = [float(np.mean(v.capacity)) for v in views]
    assert gpus[0] > gpus[1] > gpus[2] and capacity[0] > capacity[1] > capacity[2]
    for changes, spec in zip(clusters.replica_changes(), specs, strict=True):
        assert changes, "the wave makes every HPA scale"
        for _, before, after in changes:
            assert spec.replicas.min_replicas <= after <= spec.replicas.max_replicas
            assert after <= max(2 * before, before + 4)


def test_a_run_does_the_same_alone_and_beside_others() -> None:
    config = _config(slot=10.0)
    arrivals = np.stack([_arrivals(config, 7200.0, r, seed=i) for i, r in enumerate((30, 80))])
    together = [
        scenario_run(config, 0, 50.0, recorded=True),
        scenario_run(config, 1, 70.0, recorded=True),
        scenario_run(config, 0, 85.0, uses_util=False),
    ]
    both = _run(config, arrivals, together, 7200.0).views()
    alone = _run(config, arrivals, [together[1]], 7200.0).views()[0]
    np.testing.assert_allclose(both[1].waits, alone.waits, rtol=1e-12)
    assert (both[1].p99_wait, both[1].slo_share) == (alone.p99_wait, alone.slo_share)
    assert both[1].gpu_slots == pytest.approx(alone.gpu_slots, rel=1e-12)
    assert both[1].replica_changes == alone.replica_changes


def test_a_coarser_slot_counts_pods_every_500ms_so_gpu_hours_are_the_same_integral() -> None:
    """A scale-up at an instant inside a 10 s slot: the pods held from then on count for
    the part of the slot they were held, as at 500 ms."""
    figures = {}
    for slot in (0.5, 10.0):
        config = _config(slot=slot)
        arrivals = np.full(round(3600 / slot), 2.0 * slot)
        clusters = Clusters(config, arrivals, 0.0, 1, [scenario_run(config, recorded=True)])
        clusters.advance_to(600.0)
        clusters.set_replicas(603.0, np.array([5]))  # created at 618 s (sync delay 15 s)
        clusters.advance_to(3600.0)
        view = clusters.views()[0]
        gpu_seconds = view.gpu_slots * slot
        capacity = float(np.nansum(view.capacity, dtype=np.float64)) * slot
        figures[slot] = (gpu_seconds, capacity)
    for coarse, fine in zip(figures[10.0], figures[0.5], strict=True):
        assert coarse == pytest.approx(fine, rel=1e-6)  # single precision


def test_arrivals_at_a_coarser_slot_keep_the_trace_rate() -> None:
    trace = Trace("flat", 0.0, 10.0, np.full(8640, 300.0))
    fine = arrivals_from_trace(trace, 0.0, 86400.0, 1)
    coarse = arrivals_from_trace(trace, 0.0, 86400.0, 1, 10.0)
    assert len(fine) == 20 * len(coarse)
    assert coarse.sum() == pytest.approx(fine.sum(), rel=0.01)
    assert coarse.sum() == pytest.approx(30.0 * 86400, rel=0.01)


def test_a_fragment_change_disrupts_capacity_for_the_disruption_time() -> None:
    config = _config(slot=0.5)
    arrivals = np.zeros(round(600 / 0.5))
    specs = [scenario_run(config, recorded=True, observed=True) for _ in range(2)]
    clusters = Clusters(config, arrivals, 0.0, 1, specs)
    clusters.advance_to(100.0)
    d = FragmentsDecision(100.0, "a100-80gb", 2, 4, "test")
    clusters.apply(0, [d])
    clusters.advance_to(600.0)
    changed, kept = (v.capacity for v in clusters.views())
    span = config.simulator.fragment_disruption
    during = slice(200, 200 + round(span / 0.5))
    factor = config.simulator.fragment_disruption_capacity
    np.testing.assert_allclose(changed[during], kept[during] * factor)
    assert changed[-1] == kept[-1]
    assert clusters.fragment_changes == [[d], []]


def test_a_floor_lifts_the_replicas_and_holds_them_under_the_hpa() -> None:
    config = _config(slot=10.0)
    arrivals = np.zeros(round(3600 / 10.0))
    clusters = Clusters(config, arrivals, 0.0, 1, [scenario_run(config, observed=True)])
    clusters.advance_to(30.0)
    clusters.apply(0, [ReplicaFloorDecision(30.0, "serving/llm-chat", 1, 6, "test")])
    for t in range(60, 3630, 30):
        clusters.advance_to(float(t))
        clusters.hpa_step(float(t))
    assert int(clusters.spec[0]) == 6
    pool, workload = clusters.signals(0, "a100-80gb", "serving/llm-chat")
    assert (workload.floor, workload.replicas, pool.fragments) == (6, 6, 2)
    assert workload.load is not None
    assert len(workload.load.values) == round(config.metrics.window / 10.0)


def test_scaling_down_the_newest_pods_go_a_ready_one_after_draining_a_cold_one_at_once() -> None:
    pods = Pods(np.array([2]), 0.0)
    rows = np.array([0])
    pods.scale(100.0, (rows, np.array([2]), np.array([60.0, 90.0])), _none())
    ready, held = pods.counts(np.array([170.0]), rows)
    assert (ready[0, 0], held[0, 0]) == (3.0, 4.0)
    pods.scale(180.0, _none(), (rows, np.array([2]), np.array([12.0])))
    ready, held = pods.counts(np.array([179.0, 185.0, 200.0]), rows)
    assert ready[0].tolist() == [3.0, 3.0, 2.0] and held[0].tolist() == [4.0, 3.0, 2.0]


def _none() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 12), st.floats(0.0, 100.0)),
        min_size=1,
        max_size=12,
    )
)
def test_the_pods_counted_over_a_span_are_those_their_times_say(
    steps: list[tuple[int, int, float]],
) -> None:
    """Through any scale-ups and downs of three runs, `count` over each span gives every
    run's ready and GPU-holding pods at each sample as counted from their times."""
    pods = Pods(np.array([1, 2, 3]), 0.0)
    cold = iter(np.linspace(20.0, 80.0, 500))
    t = 0.0
    for run, n, gap in steps:
        t += 5.0 + gap
        first, last = t, t + 30.0
        samples = np.linspace(first, last, 7)
        moving, ready, held = pods.count(first, last, partial(np.array, samples))
        want_ready, want_held = _brute(pods, samples)
        for r in range(3):
            if r in moving:
                k = int(np.flatnonzero(moving == r)[0])
                assert ready[k].tolist() == want_ready[r].tolist()
                assert held[k].tolist() == want_held[r].tolist()
            else:  # the counts at the span's start hold all over it
                assert (want_ready[r] == pods.now_ready[r]).all()
                assert (want_held[r] == pods.now_held[r]).all()
        current = int(np.count_nonzero(pods.leave[run] == math.inf))
        rows = np.array([run])
        if n > current:
            starts = np.array([next(cold) for _ in range(n - current)])
            pods.scale(last, (rows, np.array([n - current]), starts), _none())
        elif n < current:
            pods.scale(last, _none(), (rows, np.array([n]), np.array([7.0])))
        t = last


def _brute(pods: Pods, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each run's ready and GPU-holding pods at each time of `t`, pod by pod."""
    ready = np.zeros((3, len(t)))
    held = np.zeros((3, len(t)))
    for r in range(3):
        for c, ready_at, leave in zip(pods.created[r], pods.ready[r], pods.leave[r], strict=True):
            ready[r] += (ready_at <= t) & (t < leave)
            held[r] += (c <= t) & (t < leave)
    return ready, held
