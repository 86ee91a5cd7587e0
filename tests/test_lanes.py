"""Lanes' simulated clusters advanced together (gpuscaler.sim.lanes) record, slot for slot,
what each records advanced alone: the same queue, signals, pods and HPA answers, while
floors, replica counts and fragments change under them."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gpuscaler.sim.lanes as lanes_module
from gpuscaler.config import Config, parse_config
from gpuscaler.core.decisions import FragmentsDecision, ReplicaFloorDecision, TimeSliceDecision
from gpuscaler.core.model import Series
from gpuscaler.core.snapshot import RawPool, RawWorkload
from gpuscaler.sim.cluster import RECORDED, SimulatedCluster
from gpuscaler.sim.lanes import STEPPED, WINDOWED, LaneClusters, Steps, batchable
from gpuscaler.sim.simulate import scenario_cluster
from gpuscaler.sim.ticks import control_ticks

CONFIG = """
simulator: {{preemption_burst_after: null, slot: {slot}, gpu_seconds_per_request: 0.25}}
node_pools:
  - {{name: a100, selector: {{label: nvidia.com/gpu.product, value: A100}},
     gpu_memory_gib: 80, workload_type: inference, profile: compute_bound,
     initial_fragments: {fragments}}}
workloads:
  - {{namespace: a, kind: ScaledObject, name: w, node_pool: a100,
     overrides: {{replicas: {{max_replicas: {max_replicas}, min_replicas: {min_replicas},
     target_utilization_pct: {target}}}}}}}
"""
START = 1_700_000_000.0


def _config(slot: str, lane: int) -> Config:
    fragments = (1, 2, 4)[lane % 3]
    return parse_config(
        CONFIG.format(
            slot=slot,
            fragments=fragments,
            max_replicas=(200, 6, 40)[lane % 3],
            min_replicas=(1, 0, 3)[lane % 3],
            target=(70, 50, 85)[lane % 3],
        )
    )


def _arrivals(lane: int, n: int, slot: float, seed: int) -> np.ndarray:
    """Bursty, idle and steady lanes: Poisson around a random walk."""
    rng = np.random.default_rng(seed * 100 + lane)
    level = np.exp(np.cumsum(rng.normal(0, 0.05, n))) * (0.2, 8.0, 3.0, 0.0)[lane % 4]
    bursts = np.where(rng.random(n) < 0.01, rng.uniform(5, 60, n), 0.0)
    return np.asarray(rng.poisson((level + bursts) * slot), dtype=np.float64)


def _clusters(slot: str, lanes: int, hours: float, seed: int) -> list[SimulatedCluster]:
    """Lanes of one run seed (7), or of two (seed 11: odd lanes draw other noise)."""
    out = []
    for i in range(lanes):
        config = _config(slot, i)
        n = int(hours * 3600 / config.simulator.slot)
        arrivals = _arrivals(i, n, config.simulator.slot, seed)
        out.append(scenario_cluster(config, arrivals, START, 8 if seed == 11 and i % 2 else 7))
    return out


def _decide(rng: np.random.Generator, c: SimulatedCluster, t: float) -> None:
    """The controller's decisions to a lane's cluster (`SimulatedCluster.apply`): a new
    floor (replicas raised to it), new fragments (a disruption), a new time slice."""
    u, key = rng.random(), c.workload_key
    if u < 0.08:
        floor = int(rng.integers(0, 12))
        c.apply([ReplicaFloorDecision(t, key, c.floor, floor, "test")])
    elif u < 0.11:
        fragments = int(rng.choice([1, 2, 4, 7]))
        c.apply([FragmentsDecision(t, c.pool_name, c.fragments, fragments, "test")])
    elif u < 0.13:
        level = str(rng.choice(["short", "medium", "long", "default"]))
        c.apply([TimeSliceDecision(t, c.pool_name, c.time_slice_level, level, "test")])


def _same_signals(a: SimulatedCluster, b: tuple[RawPool, RawWorkload]) -> None:
    """What the controller reads of a cluster alone and of its lane is equal (series to
    the last bit)."""
    for x, y in zip(a.signals(), b, strict=True):
        rest = {k: v for k, v in vars(x).items() if not isinstance(v, Series)}
        assert rest == {k: v for k, v in vars(y).items() if not isinstance(v, Series)}
        for k, v in vars(x).items():
            if isinstance(v, Series):
                w = getattr(y, k)
                assert (v.start, v.step) == (w.start, w.step)
                np.testing.assert_array_equal(v.values, w.values, k)


def _run(
    slot: str, lanes: int, hours: float, seed: int
) -> tuple[list[SimulatedCluster], list[SimulatedCluster]]:
    alone, together = _clusters(slot, lanes, hours, seed), _clusters(slot, lanes, hours, seed)
    batch = LaneClusters.of(together)
    first = alone[0]
    seconds = len(first.arrivals) * first.slot
    ra, rb = np.random.default_rng(seed), np.random.default_rng(seed)
    for t in control_ticks(START, seconds, first.config.control.interval):
        for c in alone:
            c.advance_to(t)
            c.hpa_step(t)
        batch.advance_to(t)
        loads, known = batch._util_loads()
        for c in alone + together:  # the kept counts, where they hold, as counted anew
            assert c.ready_count(t) == c.pods.ready_count(t)
        for i, c in enumerate(alone):  # the HPA's input, before its tolerance hides it
            lone = c.scaler._util_load(c)
            assert (lone, True) == (loads[i], known[i]) if lone is not None else not known[i]
        batch.hpa_step(t)
        pools, workloads = batch.signals([c.pool_name for c in together])
        for a, b, pool, workload in zip(alone, together, pools, workloads, strict=True):
            _same_signals(a, b.signals())
            _same_signals(a, (pool, workload))
            if round(t) % 3000 == 0:  # the stepped records read while the run goes on
                for name in STEPPED:
                    np.testing.assert_array_equal(getattr(a.rec, name), getattr(b.rec, name))
            _decide(ra, a, t)
            _decide(rb, b, t)
    for c in alone:
        c.advance_to(START + seconds)
    batch.advance_to(START + seconds)
    batch.finish()
    return alone, together


@pytest.mark.parametrize(
    ("slot", "lanes", "hours", "seed"),
    [
        ("10s", 9, 6.0, 1),
        ("10s", 1, 3.0, 2),
        ("10s", 23, 2.0, 3),
        ("500ms", 5, 1.0, 4),
        ("10s", 5, 2.0, 11),
    ],
)
def test_lanes_advanced_together_record_what_each_records_alone(
    slot: str, lanes: int, hours: float, seed: int
) -> None:
    alone, together = _run(slot, lanes, hours, seed)
    changes = 0
    for a, b in zip(alone, together, strict=True):
        for name in RECORDED:
            if name in WINDOWED:  # kept only while the controller and the HPA read them
                assert np.isnan(getattr(b.rec, name)).all()
            else:
                np.testing.assert_array_equal(getattr(a.rec, name), getattr(b.rec, name), name)
        assert a.replica_changes == b.replica_changes
        assert (a.q, a.cursor, a.spec_count()) == (b.q, b.cursor, b.spec_count())
        assert not np.isnan(b.rec.served).any()
        changes += len(a.replica_changes)
    assert changes > lanes  # the HPAs and floors did move the replicas


def test_lanes_that_draw_the_same_noise_share_one_copy_of_it() -> None:
    together = _clusters("10s", 4, 1.0, 5)
    batch = LaneClusters.of(together)
    assert batch.noise.shape[0] == batch.dropped.shape[0] == 1
    assert all(np.shares_memory(c.noise, batch.noise) for c in together)


@pytest.mark.parametrize(
    "change",
    ["advanced", "unobserved", "other_scaler", "other_slot", "none"],
)
def test_clusters_that_cannot_advance_together_are_refused(change: str) -> None:
    clusters = _clusters("10s", 3, 1.0, 6)
    if change == "advanced":
        clusters[1].advance_to(START + 30)
    elif change == "unobserved":
        clusters[2].observed = False
    elif change == "other_scaler":
        clusters[0].scaler.kind = "keda_rate"
    elif change == "other_slot":
        clusters[1] = _clusters("500ms", 2, 1.0, 6)[1]
    else:
        clusters = []
    assert not batchable(clusters)
    with pytest.raises(ValueError, match="cannot advance together"):
        LaneClusters.of(clusters)


def test_lanes_whose_windows_move_every_few_slots_read_the_same_signals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lanes_module, "ROOM", 7)
    alone, together = _run("10s", 4, 2.0, 8)
    for a, b in zip(alone, together, strict=True):
        np.testing.assert_array_equal(a.rec.served, b.rec.served)
        assert a.replica_changes == b.replica_changes


def test_a_lane_with_other_noise_gets_rows_of_its_own_and_the_others_keep_theirs() -> None:
    clusters = _clusters("10s", 4, 1.0, 9)
    config = clusters[2].config
    clusters[2] = scenario_cluster(config, clusters[2].arrivals, START, 8)  # another seed
    before = [(c.noise.copy(), c.stall_noise.copy(), c.dropped.copy()) for c in clusters]
    batch = LaneClusters.of(clusters)
    assert batch.noise.shape[0] == 4
    for c, (noise, stall, dropped) in zip(clusters, before, strict=True):
        np.testing.assert_array_equal(c.noise, noise)
        np.testing.assert_array_equal(c.stall_noise, stall)
        np.testing.assert_array_equal(c.dropped, dropped)
    assert not np.array_equal(clusters[1].noise, clusters[2].noise)


def test_lanes_advance_only_once_all_are_added() -> None:
    clusters = _clusters("10s", 3, 1.0, 10)
    batch = LaneClusters(clusters[0], 3)
    batch.add(clusters[1])
    with pytest.raises(ValueError, match="2 of 3 lanes added"):
        batch.advance_to(START + 30)
    batch.add(clusters[2])
    with pytest.raises(ValueError, match="cannot advance together"):
        batch.add(_clusters("10s", 1, 1.0, 10)[0])  # no room for a fourth


def test_lanes_keep_their_demand_and_replicas_as_changes_not_a_row_a_slot() -> None:
    alone, together = _run("10s", 3, 2.0, 12)
    batch = together[0].rec._batch  # type: ignore[attr-defined]
    assert not set(STEPPED) & set(batch.rec)
    for name in STEPPED:
        steps = batch.steps[name]
        assert all(len(c) < batch.n / 10 for c in steps.changes)
    for a, b in zip(alone, together, strict=True):
        for name in STEPPED:
            np.testing.assert_array_equal(getattr(a.rec, name), getattr(b.rec, name), name)


@pytest.mark.parametrize(
    ("puts", "n", "cursor", "expected"),
    [
        ([], 4, 0, [math.nan] * 4),
        ([(0, [1.0, 2.0])], 4, 3, [1.0, 1.0, 1.0, math.nan]),  # lane 0
        ([(0, [1.0, 2.0]), (2, [1.0, 5.0]), (3, [4.0, 5.0])], 5, 5, [1, 1, 1, 4, 4]),
        ([(0, [1.0, 2.0]), (1, [3.0, 2.0]), (2, [1.0, 2.0])], 4, 3, [1, 3, 1, math.nan]),
        ([(0, [math.nan, 2.0]), (2, [1.0, 2.0])], 4, 4, [math.nan, math.nan, 1, 1]),
    ],
)
def test_a_step_record_holds_each_value_until_the_next_change_or_the_cursor(
    puts: list[tuple[int, list[float]]], n: int, cursor: int, expected: list[float]
) -> None:
    steps = Steps(2)
    for begin, values in puts:
        steps.put(begin, np.array(values))
    np.testing.assert_array_equal(steps.row(0, n, cursor), np.array(expected, dtype=float))
