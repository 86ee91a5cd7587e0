"""The sweeps of many replays as one (`gpuscaler.sim.baselines.swept`, what-if's chunk of
workloads): each replay's curves are bit for bit those of its own sweep, whatever runs
beside it, however the runs are grouped."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpuscaler.config import Config, parse_config
from gpuscaler.sim import sweep_groups
from gpuscaler.sim.around import swept_many
from gpuscaler.sim.baselines import swept
from gpuscaler.sim.cluster import SimulatedCluster, arrivals_from_trace
from gpuscaler.sim.equal_cost import BASELINES
from gpuscaler.sim.scalers import ScalerKind
from gpuscaler.sim.simulate import Prepared, run_baselines, scenario_cluster, scenario_config
from gpuscaler.sim.sweep import Sweep
from gpuscaler.sim.swept import same_model
from gpuscaler.sim.synthetic import synthetic_trace
from gpuscaler.sim.trace import load_trace

CONFIG = """
simulator: {preemption_burst_after: null, gpu_seconds_per_request: 0.25, noise_pct: 3.0,
            slot: SLOT}
node_pools:
  - {name: a100-80gb, selector: {label: nvidia.com/gpu.product, value: A100},
     gpu_memory_gib: 80, workload_type: inference, profile: compute_bound,
     initial_fragments: FRAGMENTS}
workloads:
  - {namespace: serving, kind: ScaledObject, name: llm-chat, node_pool: a100-80gb,
     overrides: {replicas: {min_replicas: MIN, max_replicas: MAX, tolerance: TOL}}}
"""
SECONDS = 3 * 3600.0
SEED = 3
START = 1_700_000_000.0


def _config(
    slot: float = 10.0, fragments: int = 2, low: int = 1, high: int = 200, tol: float = 0.1
) -> Config:
    text = (
        CONFIG.replace("SLOT", f"{slot:g}s")
        .replace("FRAGMENTS", str(fragments))
        .replace("MIN", str(low))
        .replace("MAX", str(high))
        .replace("TOL", str(tol))
    )
    return scenario_config(parse_config(text))


def _replay(source: str, config: Config, seed: int = SEED) -> Prepared:
    """A replay of 3 h of `source` (the bundled trace from hour 96, or a synthetic family)."""
    trace = load_trace() if source == "bundled" else synthetic_trace(source, hours=3.0, seed=7)
    start = trace.start + (96 * 3600.0 if source == "bundled" else 0.0)
    slot = config.simulator.slot
    arrivals = arrivals_from_trace(trace, start, SECONDS, seed, slot)
    scored = int(config.metrics.window / slot)
    # One range for all, as what-if's workloads share theirs: the arrivals are the trace's.
    return Prepared(source, config, START, SECONDS, arrivals, seed, scored, 0.0)


def _template(p: Prepared) -> SimulatedCluster:
    return scenario_cluster(p.config, p.arrivals, p.start, p.seed, controlled=False)


def _alone(p: Prepared) -> dict[str, list[dict[str, object]]]:
    return run_baselines(p.config, p.start, p.seconds, p.arrivals, p.seed, p.scored_from)


# Workloads of one chunk: other traces and other replica bounds on one model (the bounds
# bite: at most 6 replicas; at least 3; a wide tolerance).
MIXED: list[tuple[str, dict[str, Any]]] = [
    ("bundled", {}),
    ("bursts", {"high": 6}),
    ("steps", {"low": 3}),
    ("random_walk", {"tol": 0.3}),
]


def test_each_workloads_curves_in_one_sweep_are_those_of_its_own_sweep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    replays = [_replay(source, _config(**bounds)) for source, bounds in MIXED]
    templates = [_template(p) for p in replays]
    assert all(same_model(templates[0], t) for t in templates)
    want = [_alone(p) for p in replays]
    sweeps: list[int] = []

    class Counted(Sweep):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            sweeps.append(len(self.members))

    monkeypatch.setattr(sweep_groups, "Sweep", Counted)
    got = swept_many(replays)
    assert sweeps == [len(MIXED)]  # one sweep ran every workload's runs
    assert got == want
    # The comparison is of runs that differ: each workload's curve is its own.
    hours = {p["gpu_hours"] for c in want for p in c["reactive"]}
    assert len(hours) > 3 * len(MIXED)
    assert [len(c["reactive"]) for c in got] == [11] * len(MIXED)


@pytest.mark.parametrize("budget", [16 * 1080 * 5, 16 * 1080 * 40, 2**28])
def test_grouping_the_runs_of_many_workloads_changes_no_figure(budget: int) -> None:
    """Groups of 5 runs (a workload's runs split across groups), of 40 (groups spanning
    workloads) and all at once (3 h at 10 s: 1,080 slots, 16 bytes a run a slot)."""
    replays = [_replay(source, _config(**bounds)) for source, bounds in MIXED[:3]]
    want = [_alone(p) for p in replays]
    items = [(_template(p), p.scored_from) for p in replays]
    got = swept(replays[0].config, items, SEED, SECONDS, budget=budget)
    assert got == want


def test_replays_on_other_models_are_swept_apart_with_the_same_figures() -> None:
    """Other fragments, another seed (other noise) or another slot cannot share a sweep:
    they are grouped apart, each still with its own curves, in the caller's order."""
    replays = [
        _replay("bundled", _config()),
        _replay("bundled", _config(fragments=4)),
        _replay("steps", _config()),
        _replay("bursts", _config(), seed=SEED + 1),
        _replay("bursts", _config(slot=5.0)),
    ]
    assert swept_many(replays) == [_alone(p) for p in replays]


@pytest.mark.parametrize(
    ("other", "why"),
    [
        ({"fragments": 4}, "fragments"),
        ({"slot": 5.0}, "slot"),
    ],
)
def test_a_sweep_refuses_rows_of_another_model(other: dict[str, Any], why: str) -> None:
    a = _template(_replay("bundled", _config()))
    b = _template(_replay("bundled", _config(**other)))
    runs: list[tuple[ScalerKind, float]] = [("hpa_util", 70.0), ("keda_rate", 70.0)]
    with pytest.raises(ValueError, match="model"):
        Sweep(a.config, a, runs, SEED, [a, b])


def test_a_sweep_refuses_rows_of_other_noise() -> None:
    a = _template(_replay("bundled", _config()))
    b = _template(_replay("bundled", _config(), seed=SEED + 1))
    with pytest.raises(ValueError, match="model"):
        Sweep(a.config, a, [("hpa_util", 70.0)] * 2, SEED, [a, b])


def test_each_run_of_a_mixed_sweep_serves_what_it_serves_in_its_own_sweep() -> None:
    """Below the curves: served work and GPUs held per slot, and every replica change."""
    replays = [_replay(source, _config(**bounds)) for source, bounds in MIXED]
    templates = [_template(p) for p in replays]
    runs = [(kind, 55.0) for kind in BASELINES.values()]
    rows = [t for t in templates for _ in runs]
    mixed = Sweep(replays[0].config, templates[0], runs * len(replays), SEED, rows)
    got = mixed.run(replays[0].start, SECONDS)
    for w, t in enumerate(templates):
        alone = Sweep(replays[w].config, t, runs, SEED).run(t.start, SECONDS)
        for a, b in zip(alone, got[w * len(runs) : (w + 1) * len(runs)], strict=True):
            assert a.replica_changes == b.replica_changes
            assert np.array_equal(a.served, b.served, equal_nan=True)
            assert np.array_equal(a.gpus, b.gpus, equal_nan=True)
    assert sum(len(r.replica_changes) for r in got) > 4 * len(got)
