"""The runs around gpuscaler's of one replay or many, as one sweep
(`gpuscaler.sim.sweep`): the baselines swept over their targets, the reactive HPA (the
simulator's reference run: `hpa_util` at the workload's target with its min_replicas
floor, no controller) and the replicas that actually ran (what-if's third replay: the
replicas set at each control tick to the count read, no scaler); and `simulate`, the
whole replay of a trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuscaler.config import Config
from gpuscaler.core.model import FloatArray, Series
from gpuscaler.sim.cluster import scenario_run
from gpuscaler.sim.equal_cost import BASELINES
from gpuscaler.sim.lockstep import lockstep_runs
from gpuscaler.sim.records import RunView
from gpuscaler.sim.scalers import IntArray
from gpuscaler.sim.simulate import (
    ForecastTrack,
    Prepared,
    RunResult,
    SimulationResult,
    finish,
    prepare,
    release,
    slo_metrics,
)
from gpuscaler.sim.sweep import (
    SWEEP_BYTES,
    Curves,
    Swept,
    baseline_runs,
    point,
    same_model,
    sweep_groups,
)
from gpuscaler.sim.ticks import control_ticks
from gpuscaler.sim.trace import Trace

if TYPE_CHECKING:
    from gpuscaler.observability import ControllerMetrics

MANY_BYTES = 64 * 2**20
"""What one group of a what-if chunk's sweep may record by default, less than a lone
sweep's SWEEP_BYTES: whatif holds its lanes' runs meanwhile, in each of its processes."""


REACTIVE, ACTUAL = "reactive HPA run", "replicas that ran"
"""The labels of a replay's runs in a sweep besides its baselines' (named by baseline)."""


@dataclass
class Around:
    """What runs around gpuscaler's run of one replay."""

    curves: Curves | None
    """The baselines' curves (None: not swept)."""
    reactive: RunResult | None
    """The reactive HPA's run (None: not run)."""
    actual: dict[str, Any] | None
    """The figures of the replicas that ran (`actual_figures`; None: unknown)."""


def held(replicas: Series) -> FloatArray:
    """The replica counts with the last known one held over each gap (and the first
    known one before it)."""
    values = replicas.values.copy()
    finite = np.isfinite(values)
    if not finite.any():
        return values
    idx = np.where(finite, np.arange(len(values)), 0)
    np.maximum.accumulate(idx, out=idx)
    values = values[idx]
    first = int(np.flatnonzero(finite)[0])
    values[:first] = values[first]
    return values


def actual_counts(replicas: Series, ticks: Sequence[float]) -> IntArray:
    """The replicas that ran at each tick (the last read at or before it, held over gaps,
    rounded half to even, at least 1), for all ticks at once."""
    counts = held(replicas)
    at = (np.asarray(ticks, dtype=np.float64) - replicas.start) / replicas.step
    index = np.clip(np.floor(at), 0, len(counts) - 1).astype(np.int64)
    values = counts[index]
    if not np.isfinite(values).all():
        raise ValueError("a replica count read is not finite")
    return np.maximum(1, np.rint(values)).astype(np.int64)


def actual_figures(view: RunView, p: Prepared) -> dict[str, Any]:
    """The SLO figures of the replay with the replicas that ran, and their mean."""
    s = slice(p.scored_from, view.cursor)
    return {
        **slo_metrics(view, p.scored_from, p.config.simulator.slo_wait),
        "mean_replicas": round(float(np.mean(view.rec.replicas[s])), 2),
    }


def _groups(prepared: Sequence[Prepared]) -> list[list[int]]:
    """The replays that can share a sweep (`sweep.same_model`)."""
    groups: list[list[int]] = []
    for i, p in enumerate(prepared):
        for g in groups:
            if same_model(prepared[g[0]], p):
                g.append(i)
                break
        else:
            groups.append([i])
    return groups


def _runs(
    replays: Sequence[Prepared],
    replicas: Sequence[Series | None],
    baselines: bool,
    reactive: bool,
) -> list[tuple[str, Swept]]:
    """Each replay's runs of a sweep, labelled: its baselines' (by baseline name), its
    reactive HPA's (REACTIVE), its replicas that ran (ACTUAL)."""
    runs: list[tuple[str, Swept]] = []
    for w, (p, series) in enumerate(zip(replays, replicas, strict=True)):
        if baselines:
            runs += baseline_runs(w)
        target = scenario_run(p.config).target_pct
        if reactive:
            runs.append((REACTIVE, Swept(w, "hpa_util", target, recorded=True)))
        if series is not None:
            ticks = control_ticks(p.start, p.seconds, p.config.control.interval)
            counts = actual_counts(series, ticks)
            runs.append((ACTUAL, Swept(w, "hpa_util", target, counts, recorded=True)))
    return runs


def around_many(
    prepared: Sequence[Prepared],
    replicas: Sequence[Series | None] | None = None,
    baselines: bool = True,
    reactive: bool = True,
    budget: int = MANY_BYTES,
    released: bool | None = None,
) -> list[Around]:
    """For each replay: the baselines' curves when `baselines`, the reactive HPA's run
    when `reactive`, and the figures of its `replicas` that ran when given; those of
    replays that share a model in one sweep, in groups within `budget` bytes (each run's
    figures taken, and its record let go, as soon as its group ends). With `released`
    (True: with the plot's series, False: without) each reactive run is
    `simulate.release`d as soon as it is found; None keeps its whole record."""
    given = list(replicas) if replicas is not None else [None] * len(prepared)
    out = [Around(None, None, None) for _ in prepared]
    for g in _groups(prepared):
        replays = [prepared[i] for i in g]
        runs = _runs(replays, [given[i] for i in g], baselines, reactive)
        curves: list[Curves] = [{name: [] for name in BASELINES} for _ in g]
        for first, views in sweep_groups(replays, [r for _, r in runs], budget):
            for (label, run), view in zip(runs[first:], views, strict=False):
                p, found = replays[run.replay], out[g[run.replay]]
                if label == REACTIVE:
                    result = RunResult("reactive", view, [], ForecastTrack(), 0)
                    found.reactive = result if released is None else release(p, result, released)
                elif label == ACTUAL:
                    found.actual = actual_figures(view, p)
                else:
                    curves[run.replay][label].append(point(p, run.target_pct, view))
            del views
        for w, i in enumerate(g):
            out[i].curves = curves[w] if baselines else None
    return out


def reactive_run(p: Prepared) -> RunResult:
    """The reactive HPA alone on the replay (the simulator's reference run)."""
    [around] = around_many([p], baselines=False)
    assert around.reactive is not None
    return around.reactive


def actual_run(p: Prepared, replicas: Series) -> dict[str, Any]:
    """SLO figures of the replay with the replicas that ran (read at each control
    interval), at the pool's initial fragments (the fragments that ran are not read)."""
    [around] = around_many([p], [replicas], baselines=False, reactive=False)
    assert around.actual is not None
    return around.actual


def baseline_curves(
    p: Prepared, targets: Sequence[float] | None = None, names: Sequence[str] | None = None
) -> Curves:
    """Every baseline (or those `names`) at every target (default
    `equal_cost.sweep_targets()`) on the replay."""
    runs = baseline_runs(0, targets, names)
    curves: Curves = {name: [] for name in BASELINES if names is None or name in names}
    for first, views in sweep_groups([p], [r for _, r in runs], SWEEP_BYTES):
        for (name, run), view in zip(runs[first:], views, strict=False):
            curves[name].append(point(p, run.target_pct, view))
    return curves


def swept_many(prepared: Sequence[Prepared]) -> list[Curves]:
    """The baselines' curves of each replay, those of replays that share a model swept
    as one."""
    out = []
    for a in around_many(prepared, reactive=False):
        assert a.curves is not None
        out.append(a.curves)
    return out


def simulate(
    trace: Trace,
    hours: float | None,
    seed: int,
    config: Config,
    start_hours: float = 0.0,
    metrics: Sequence[ControllerMetrics] = (),
    baselines: bool = True,
) -> SimulationResult:
    """Replay `hours` of `trace` (all of it when None) from `start_hours` into it: the
    real controller's run, and the reactive HPA and the baselines in one sweep."""
    p = prepare(trace, hours, seed, config, start_hours)
    [run] = lockstep_runs([p], metrics=metrics)
    [around] = around_many([p], baselines=baselines, budget=SWEEP_BYTES)
    assert around.reactive is not None
    return finish(p, run, around.reactive, around.curves)
