"""The runs around gpuscaler's of many replays in one sweep (`gpuscaler.sim.around`): the
reactive HPA, the replicas that ran and the baselines. Each run's record and figures are
bit for bit those of its own `SimulatedCluster` (`simulate.reactive_run`,
`replay.actual_run`, kept as the reference), whatever runs beside it, however grouped."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_lockstep import _history as lockstep_history
from test_sweep_many import MIXED, _alone, _config, _replay

from gpuscaler.config import parse_config
from gpuscaler.core.history import Signal, WorkloadHistory
from gpuscaler.core.model import Series
from gpuscaler.sim import around as around_module
from gpuscaler.sim import sweep as sweep_module
from gpuscaler.sim import sweep_groups
from gpuscaler.sim.around import Around, actual_counts, actual_run, around_many
from gpuscaler.sim.cluster import RECORDED
from gpuscaler.sim.replay import (
    Ready,
    WorkloadReplay,
    finished,
    ready,
    replay_many,
)
from gpuscaler.sim.simulate import Prepared, RunResult, gpuscaler_run, reactive_run
from gpuscaler.sim.sweep import Sweep
from gpuscaler.sim.ticks import control_ticks


def _schedule(p: Prepared, seed: int, high: int = 9) -> Series:
    """Replica counts read every 60 s, from 10 minutes before the replay to 20 minutes
    before its end (the first and last reads held beyond), with gaps and zeros (at
    least 1 replica runs), up to `high` (past a low max_replicas: what ran is not bounded)."""
    rng = np.random.default_rng(seed)
    n = round((p.seconds - 600.0) / 60.0)
    counts = np.repeat(rng.integers(0, high + 1, n // 5 + 1), 5)[:n].astype(np.float64)
    counts[rng.random(n) < 0.1] = np.nan
    return Series(p.start - 600.0, 60.0, counts)


UNKEPT = ("queue", "load", "pool_util", "stall")
"""What a run in the sweep does not record (no figure or plot reads it): NaN."""


def _same_record(alone: RunResult, got: RunResult | None) -> None:
    assert got is not None
    a, b = alone.cluster, got.cluster
    for name in RECORDED:
        want = getattr(a.rec, name)
        if name in UNKEPT:
            assert np.isnan(getattr(b.rec, name)).all() and len(want) == len(b.rec.served)
            continue
        assert np.array_equal(want, getattr(b.rec, name), equal_nan=True), name
    assert a.cursor == b.cursor
    assert a.replica_changes == b.replica_changes


# The mixed replays of one model, and others apart: 500 ms and 2 s slots (pods counted
# within a slot), 4 fragments, min_replicas 0.
CASES: list[tuple[str, dict[str, Any]]] = [
    *MIXED,
    ("bursts", {"slot": 0.5, "low": 0}),
    ("diurnal", {"slot": 2.0, "fragments": 4}),
]


def _cases() -> list[Prepared]:
    return [_replay(source, _config(**bounds)) for source, bounds in CASES]


def test_each_reactive_run_in_the_sweep_records_what_its_own_cluster_records() -> None:
    replays = _cases()
    got = around_many(replays, baselines=False)
    for p, a in zip(replays, got, strict=True):
        alone = reactive_run(p)
        _same_record(alone, a.reactive)
        assert a.curves is None and a.actual is None
    # The runs differ (not one run repeated) and scale.
    hours = {float(np.nansum(a.reactive.cluster.rec.gpus)) for a in got if a.reactive}
    assert len(hours) == len(replays)
    assert sum(len(a.reactive.cluster.replica_changes) for a in got if a.reactive) > 50


def test_the_replicas_that_ran_in_the_sweep_give_the_figures_of_their_own_run() -> None:
    replays = _cases()
    schedules = [_schedule(p, i) for i, p in enumerate(replays)]
    got = around_many(replays, schedules, baselines=False, reactive=False)
    want = [
        actual_run(p.config, s, p.arrivals, p.start, p.seconds, p.seed, p.scored_from)
        for p, s in zip(replays, schedules, strict=True)
    ]
    assert [a.actual for a in got] == want
    assert all(a.reactive is None for a in got)
    assert len({w["gpu_hours"] for w in want}) == len(want)
    assert all(w["scaling_actions"] > 10 for w in want)


def test_workloads_without_replicas_that_ran_get_none_beside_those_with() -> None:
    replays = [_replay(source, _config(**bounds)) for source, bounds in MIXED]
    schedules = [_schedule(p, i) if i % 2 else None for i, p in enumerate(replays)]
    got = around_many(replays, schedules, baselines=False)
    for p, s, a in zip(replays, schedules, got, strict=True):
        want = None
        if s is not None:
            want = actual_run(p.config, s, p.arrivals, p.start, p.seconds, p.seed, p.scored_from)
        assert a.actual == want
        _same_record(reactive_run(p), a.reactive)


def test_one_sweep_runs_every_workloads_reactive_actual_and_baseline_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    replays = [_replay(source, _config(**bounds)) for source, bounds in MIXED]
    schedules = [_schedule(p, i) for i, p in enumerate(replays)]
    sweeps: list[int] = []

    class Counted(Sweep):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            sweeps.append(len(self.kinds))

    monkeypatch.setattr(sweep_groups, "Sweep", Counted)
    got = around_many(replays, schedules)
    assert sweeps == [len(MIXED) * (33 + 2)]  # one sweep: 33 points, reactive, actual
    for p, s, a in zip(replays, schedules, got, strict=True):
        assert a.curves == _alone(p)
        assert a.actual == actual_run(
            p.config, s, p.arrivals, p.start, p.seconds, p.seed, p.scored_from
        )
        _same_record(reactive_run(p), a.reactive)


@pytest.mark.parametrize("runs_a_group", [3, 36, 1000])
def test_grouping_the_runs_changes_no_record_and_no_figure(runs_a_group: int) -> None:
    """Groups of 3 runs (a workload's reactive and actual runs in other groups than its
    baselines), of 36 (a group spanning both workloads), all at once."""
    replays = [_replay(source, _config(**bounds)) for source, bounds in MIXED[:2]]
    schedules = [_schedule(p, i) for i, p in enumerate(replays)]
    budget = sweep_module.RUN_SLOT_BYTES * len(replays[0].arrivals) * runs_a_group
    got = around_many(replays, schedules, budget=budget)
    for p, s, a in zip(replays, schedules, got, strict=True):
        assert a.curves == _alone(p)
        assert a.actual == actual_run(
            p.config, s, p.arrivals, p.start, p.seconds, p.seed, p.scored_from
        )
        _same_record(reactive_run(p), a.reactive)


@pytest.mark.parametrize(
    ("start", "step", "values", "want"),
    [
        (0.0, 60.0, [3.0, 5.0], [3, 5, 5, 5, 5]),  # ticks at 30..150 s: the read at or
        (80.0, 60.0, [2.0, 4.0], [2, 2, 2, 2, 4]),  # before; before the first: the first
        (0.0, 60.0, [np.nan, 0.0, np.nan], [1, 1, 1, 1, 1]),  # at least 1; gaps held
        (0.0, 30.0, [1.0, 2.5, 4.4, 4.6, 7.0], [2, 4, 5, 7, 7]),  # rounded half to even
    ],
)
def test_the_replicas_that_ran_at_each_tick(
    start: float, step: float, values: list[float], want: list[int]
) -> None:
    ticks = control_ticks(0.0, 150.0, 30.0)
    assert ticks == [30.0, 60.0, 90.0, 120.0, 150.0]
    got = actual_counts(Series(start, step, np.array(values)), ticks)
    assert got.tolist() == want


CONFIG = """
simulator: {preemption_burst_after: null, gpu_seconds_per_request: 0.25, slot: 10s}
node_pools:
  - {name: a100-80gb, selector: {label: nvidia.com/gpu.product, value: A100},
     gpu_memory_gib: 80, workload_type: inference, profile: compute_bound,
     initial_fragments: 2}
workloads:
  - {namespace: s, kind: ScaledObject, name: a, node_pool: a100-80gb}
  - {namespace: s, kind: ScaledObject, name: b, node_pool: a100-80gb}
  - {namespace: s, kind: HorizontalPodAutoscaler, name: c, node_pool: a100-80gb,
     overrides: {replicas: {max_replicas: 5}}}
"""


def _history(key: str, rate: np.ndarray, replicas: Series | None) -> WorkloadHistory:
    """test_lockstep's history of `rate` (10 s, from 1000 s), with `replicas` that ran."""
    h = lockstep_history(key, rate)
    ran = Signal("kube_deployment_status_replicas", "q_rep", replicas)
    return WorkloadHistory(h.key, h.start, h.end, h.step, h.requests, h.load, ran)


@pytest.mark.timeout(600)  # three gpuscaler runs twice: minutes on a loaded machine
def test_replay_many_reports_what_each_run_apart_reports() -> None:
    """whatif's replays with the runs around gpuscaler's in one sweep: the same summaries
    (figures, equal cost, verdict, the replicas that ran with their source) as with the
    reactive and actual runs each in its own cluster and the baselines swept alone."""
    config = parse_config(CONFIG)
    rng = np.random.default_rng(5)
    n = 360 + 3  # an hour at 10 s, one step of margin each side
    histories = []
    for i, w in enumerate(config.workloads):
        rate = rng.uniform(5, 60, n) * (1 + np.sin(np.arange(n) / (30 + 11 * i)))
        replicas = (
            None if i == 1 else Series(1000.0, 60.0, rng.integers(1, 7, n // 6).astype(np.float64))
        )
        histories.append((_history(w.key, rate, replicas), w))
    got = []
    for done in replay_many(histories, config, 1, lanes=3):
        assert isinstance(done, WorkloadReplay)
        got.append(done.summary())
    want = []
    for h, w in histories:
        r = ready(h, config, w, 1)
        assert isinstance(r, Ready)
        want.append(finished(r, gpuscaler_run(r.prepared), True, None).summary())
    assert got == want
    assert [s["actual"] is None for s in got] == [False, True, False]
    assert all(s["actual"]["scaling_actions"] > 10 for s in got if s["actual"])
    assert all(len(s["baselines"]["reactive"]) == 11 and s["reactive"]["gpu_hours"] for s in got)


def test_an_around_without_runs_holds_nothing() -> None:
    replays = [_replay("bundled", _config())]
    assert around_many(replays, baselines=False, reactive=False) == [Around(None, None, None)]


def test_each_replays_reactive_and_actual_runs_are_taken_as_soon_as_its_group_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A replay's extra runs sit beside its baselines' runs and are let go with its group
    (a sweep of many replays never holds every replay's records at once)."""
    replays = [_replay(source, _config(**bounds)) for source, bounds in MIXED[:3]]
    schedules = [_schedule(p, i) for i, p in enumerate(replays)]
    events: list[str] = []

    class Counted(Sweep):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            events.append("sweep")

    real = around_module._ran

    def ran(*args: Any) -> Any:
        events.append("ran")
        return real(*args)

    monkeypatch.setattr(sweep_groups, "Sweep", Counted)
    monkeypatch.setattr(around_module, "_ran", ran)
    budget = sweep_module.RUN_SLOT_BYTES * len(replays[0].arrivals) * (33 + 2)  # a replay a group
    got = around_many(replays, schedules, budget=budget)
    assert events == ["sweep", "ran", "ran"] * 3
    for p, s, a in zip(replays, schedules, got, strict=True):
        assert a.curves == _alone(p)
        assert a.actual == actual_run(
            p.config, s, p.arrivals, p.start, p.seconds, p.seed, p.scored_from
        )
        _same_record(reactive_run(p), a.reactive)
