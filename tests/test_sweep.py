"""The baselines' sweep (`gpuscaler.sim.sweep`) runs every swept target at once and gives,
bit for bit, what one `SimulatedCluster` per target gives (`tests/per_run_baselines.py`):
on the bundled trace and synthetic families, at 500 ms, 2 s and 10 s slots, at targets
below 40 %, with bounds that bite and with scale to zero."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from per_run_baselines import per_run_baselines

from gpuscaler.config import Config, parse_config
from gpuscaler.sim import sweep_groups
from gpuscaler.sim.cluster import arrivals_from_trace
from gpuscaler.sim.equal_cost import BASELINES
from gpuscaler.sim.pods import Pods, PodTable
from gpuscaler.sim.simulate import _run, run_baselines, scenario_cluster, scenario_config
from gpuscaler.sim.sweep import RUN_SLOT_BYTES, Sweep
from gpuscaler.sim.synthetic import synthetic_trace
from gpuscaler.sim.trace import Trace, load_trace

DEFAULT = Path(__file__).parents[1] / "config" / "gpuscaler.yaml"
HEAVY = """
simulator: {preemption_burst_after: null, gpu_seconds_per_request: 0.25, noise_pct: 3.0}
node_pools:
  - {name: a100-80gb, selector: {label: nvidia.com/gpu.product, value: A100},
     gpu_memory_gib: 80, workload_type: inference, profile: compute_bound,
     initial_fragments: FRAGMENTS}
workloads:
  - {namespace: serving, kind: ScaledObject, name: llm-chat, node_pool: a100-80gb,
     overrides: {replicas: {min_replicas: MIN, max_replicas: MAX}}}
"""


def _heavy(fragments: int = 2, min_replicas: int = 1, max_replicas: int = 200) -> str:
    return (
        HEAVY.replace("FRAGMENTS", str(fragments))
        .replace("MIN", str(min_replicas))
        .replace("MAX", str(max_replicas))
    )


def _config(text: str | None, slot: float) -> Config:
    config = parse_config(DEFAULT.read_text() if text is None else text)
    sim = config.simulator.model_copy(update={"slot": slot})
    return scenario_config(config.model_copy(update={"simulator": sim}))


def _trace(source: str) -> Trace:
    if source == "bundled":
        return load_trace()
    return synthetic_trace(source, hours=3.0, seed=7)


CASES: dict[str, tuple[str, str | None, float, float, float, int]] = {
    # name: (trace, config text, slot, start hour, hours, seed)
    "bundled_500ms": ("bundled", None, 0.5, 30.0, 1.5, 1),
    "bundled_10s_heavy": ("bundled", _heavy(), 10.0, 96.0, 3.0, 3),
    "bursts_500ms_heavy": ("bursts", _heavy(), 0.5, 0.0, 2.0, 2),
    "steps_2s_four_fragments": ("steps", _heavy(fragments=4), 2.0, 0.0, 3.0, 5),
    "random_walk_10s_bounds_bite": ("random_walk", _heavy(max_replicas=6), 10.0, 0.0, 3.0, 4),
    "diurnal_500ms_scale_to_zero": ("diurnal", _heavy(min_replicas=0), 0.5, 0.0, 2.0, 6),
}
TARGETS = (20, 35, 40, 70, 90)


def _replay(name: str) -> tuple[Config, float, float, Any, int]:
    source, text, slot, start_hour, hours, seed = CASES[name]
    trace = _trace(source)
    config = _config(text, slot)
    start = trace.start + start_hour * 3600
    arrivals = arrivals_from_trace(trace, start, hours * 3600, seed, slot)
    return config, start, hours * 3600, arrivals, seed


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_swept_run_holds_and_serves_exactly_what_its_lone_run_does(name: str) -> None:
    config, start, seconds, arrivals, seed = _replay(name)
    runs = [(kind, float(t)) for kind in BASELINES.values() for t in TARGETS]
    template = scenario_cluster(config, arrivals, start, seed, controlled=False)
    sweep = Sweep(config, template, runs, seed)
    results = sweep.run(start, seconds)
    scaled = 0
    for (kind, target), got in zip(runs, results, strict=True):
        lone = _run(kind, config, start, seconds, arrivals, seed, scaler=(kind, target)).cluster
        n = lone.cursor
        assert sweep.cursor == n
        where = f"{kind}@{target}"
        assert got.replica_changes == lone.replica_changes, where
        assert np.array_equal(got.served[:n], lone.rec.served[:n]), where
        assert np.array_equal(got.gpus[:n], lone.rec.gpus[:n]), where
        scaled += len(lone.replica_changes)
    assert scaled >= 2 * len(runs)  # the runs scale: the comparison is not of idle runs


@pytest.mark.parametrize("name", ["bundled_10s_heavy", "bursts_500ms_heavy"])
def test_the_baseline_curves_are_those_of_the_per_run_code(name: str) -> None:
    config, start, seconds, arrivals, seed = _replay(name)
    scored = int(config.metrics.window / config.simulator.slot)
    want = per_run_baselines(config, start, seconds, arrivals, seed, scored)
    got = run_baselines(config, start, seconds, arrivals, seed, scored)
    assert got == want
    assert [p["target_pct"] for p in got["reactive"]] == list(range(40, 91, 5))
    assert len({p["gpu_hours"] for p in got["reactive"]}) > 5  # the targets differ


def test_the_swept_targets_come_from_the_caller_so_targets_below_40_run() -> None:
    config, start, seconds, arrivals, seed = _replay("steps_2s_four_fragments")
    got = run_baselines(config, start, seconds, arrivals, seed, 0, targets=(10, 25))
    assert {name: [p["target_pct"] for p in c] for name, c in got.items()} == {
        name: [10, 25] for name in BASELINES
    }
    reactive = got["reactive"]
    assert reactive[0]["gpu_hours"] > reactive[1]["gpu_hours"]  # a lower target holds more


@pytest.mark.parametrize(
    ("created", "ready", "leave", "first", "last", "moving"),
    [
        ([0.0], [0.0], [np.inf], 10.0, 20.0, False),  # nothing happens
        ([0.0], [15.0], [np.inf], 10.0, 20.0, True),  # turns ready inside
        ([0.0], [20.0], [np.inf], 10.0, 20.0, True),  # at the last sample: counted
        ([0.0], [10.0], [np.inf], 10.0, 20.0, False),  # at the first: already counted
        ([0.0], [0.0], [12.0], 10.0, 20.0, True),  # leaves inside
        ([12.0], [80.0], [np.inf], 10.0, 20.0, True),  # created inside
    ],
)
def test_a_run_is_counted_sample_by_sample_only_when_a_pod_changes_in_the_interval(
    created: list[float],
    ready: list[float],
    leave: list[float],
    first: float,
    last: float,
    moving: bool,
) -> None:
    still = Pods.running(2, 0.0)
    pods = Pods(np.array(created), np.array(ready), np.array(leave))
    table = PodTable([still, pods])
    table.count(first - 1.0, first, lambda: np.array([first - 1.0, first]))  # up to `first`
    samples = np.linspace(first, last, 5)
    _, changing, counted_ready, counted_held = table.count(first, last, lambda: samples)
    assert changing.tolist() == ([1] if moving else [])
    if moving:  # counted at every sample
        want = pods.counts(samples)
        assert np.array_equal(counted_ready[0], want[0])
        assert np.array_equal(counted_held[0], want[1])
    want_ready, want_held = pods.counts(np.array([last]))
    assert (table.now_ready[1], table.now_held[1]) == (want_ready[0], want_held[0])


def test_the_pod_table_counts_what_each_runs_pods_count() -> None:
    rng = np.random.default_rng(3)
    runs = []
    for r in range(4):
        pods = Pods.running(r + 1, 0.0)
        pods.add(20.0, rng.uniform(60, 120, 3 * r + 1))
        pods.remove_newest(r + 2, 90.0, 5.0)
        runs.append(pods)
    table = PodTable(runs)
    t = np.arange(0.0, 300.0, 0.5)
    ready, held = table.counts(t, np.arange(len(runs)))
    for r, pods in enumerate(runs):
        want_ready, want_held = pods.counts(t)
        assert np.array_equal(ready[r], want_ready) and np.array_equal(held[r], want_held)
        at_100 = table.counts_at(100.0, np.array([r]))
        assert (at_100[0][0], at_100[1][0]) == (want_ready[200], want_held[200])
        assert all(table.ready_at(x)[r] == pods.ready_count(x) for x in (0.0, 95.0, 150.0))


def test_a_sweep_too_large_for_its_memory_runs_in_groups_with_the_same_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config, start, seconds, arrivals, seed = _replay("bursts_500ms_heavy")
    whole = run_baselines(config, start, seconds, arrivals, seed, 0, targets=(40, 70))
    built: list[int] = []

    class Counted(Sweep):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            built.append(len(self.kinds))

    monkeypatch.setattr(sweep_groups, "Sweep", Counted)
    monkeypatch.setattr(
        sweep_groups, "SWEEP_BYTES", 2 * RUN_SLOT_BYTES * len(arrivals)
    )  # 2 a group
    grouped = run_baselines(config, start, seconds, arrivals, seed, 0, targets=(40, 70))
    assert built == [2, 2, 2]
    assert grouped == whole
