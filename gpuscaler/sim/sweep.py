"""The runs around gpuscaler's, without a controller, as runs of one model: the baselines
swept over their targets, the reactive HPA (`hpa_util` at the workload's target) and the
replicas that ran (set at each tick). Floor and fragments stay at their initial values, so
the request rate and the predictive forecast, read from the arrivals alone, are computed
once for every tick. A run keeps its figures, not its slots (but one drawn), so all step
together whatever the replay's length."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpuscaler.core.model import FloatArray, Series
from gpuscaler.sim.cluster import Clusters, scenario_run
from gpuscaler.sim.equal_cost import BASELINES, sweep_targets
from gpuscaler.sim.records import RunResult, RunView, finished, slo_metrics
from gpuscaler.sim.replay import Prepared, one_model
from gpuscaler.sim.scalers import (
    IntArray,
    ScalerKind,
    dynamo_loads,
    predicted_loads,
    rate_loads,
)

REACTIVE, ACTUAL = "reactive HPA run", "replicas that ran"
"""The labels of a replay's runs besides its baselines' (labelled by baseline)."""

Curves = dict[str, list[dict[str, Any]]]
"""Per baseline, its figures at each swept target (`slo_metrics` + target_pct)."""


@dataclass(frozen=True)
class Swept:
    """A run of replay `replay`: `kind` at `target_pct`, or with `replicas`, tick k setting
    replicas[k]; `recorded`: its slots kept for the plot."""

    label: str
    replay: int
    kind: ScalerKind
    target_pct: float
    replicas: IntArray | None = None
    recorded: bool = False


@dataclass
class Around:
    """What runs around gpuscaler's run of one replay (None: not run)."""

    curves: Curves | None
    reactive: RunResult | None
    actual: dict[str, Any] | None
    """The SLO figures and mean of the replicas that ran (`actual_figures`)."""


def sweep_views(replays: Sequence[Prepared], runs: Sequence[Swept]) -> list[RunView]:
    """Every run of `runs` stepped together over the replays' range (one model)."""
    used = sorted({r.replay for r in runs})
    one_model([replays[u] for u in used])
    member = {replay: m for m, replay in enumerate(used)}
    specs = [
        scenario_run(
            replays[r.replay].config,
            member[r.replay],
            r.target_pct,
            uses_util=r.kind not in ("keda_rate", "dynamo_sla"),
            recorded=r.recorded,
        )
        for r in runs
    ]
    p = replays[used[0]]
    arrivals = np.stack([replays[u].arrivals for u in used])
    clusters = Clusters(p.config, arrivals, p.start, p.seed, specs, p.scored_from)
    ticks = p.ticks()
    signal = _signals(clusters, runs, [member[r.replay] for r in runs], ticks, p)
    given = [(i, r.replicas) for i, r in enumerate(runs) if r.replicas is not None]
    rows = np.array([i for i, _ in given], dtype=np.int64)
    counts = np.stack([c for _, c in given], axis=1) if given else None
    fixed = np.full(len(runs), -1, dtype=np.int64)
    for k, t in enumerate(ticks):
        clusters.advance_to(t)
        if counts is not None:
            fixed[rows] = counts[k]
        sig = None if signal is None else signal(k)
        clusters.hpa_step(t, sig, None if counts is None else fixed)
    clusters.advance_to(p.start + p.seconds)
    return clusters.views()


def _signals(
    clusters: Clusters,
    runs: Sequence[Swept],
    members: Sequence[int],
    ticks: Sequence[float],
    p: Prepared,
) -> Callable[[int], FloatArray] | None:
    """Per tick, each run's load read besides the utilization (KEDA's request rate, the
    predictive floor's forecast; NaN: none), for every tick at once from each replay's
    arrivals; None when no run reads one."""
    slot, n = clusters.slot, clusters.n
    steps = np.round((np.asarray(ticks) - clusters.start) / slot).astype(np.int64)
    cursors = np.maximum.accumulate(np.minimum(n, np.maximum(steps, 0)))
    gps, horizon = clusters.sim.gpu_seconds_per_request, p.config.forecast.horizon

    def loads(kind: ScalerKind, arrivals: FloatArray) -> FloatArray:
        if kind == "keda_rate":
            return rate_loads(arrivals, cursors, slot, gps)
        if kind == "dynamo_sla":
            return dynamo_loads(arrivals, cursors, slot, gps)
        return predicted_loads(100.0 * (arrivals * gps) / slot, cursors, slot, horizon)

    pairs = [(r.kind, m) for r, m in zip(runs, members, strict=True)]
    col = {pair: i for i, pair in enumerate(dict.fromkeys(x for x in pairs if x[0] != "hpa_util"))}
    if not col:
        return None
    none = np.full(len(ticks), np.nan)
    table = np.stack([*(loads(k, clusters.arrivals[m]) for k, m in col), none], axis=1)
    cols = np.array([col.get(pair, len(col)) for pair in pairs])
    return lambda k: np.asarray(table[k, cols])


def point(p: Prepared, target: float, view: RunView) -> dict[str, Any]:
    """A baseline's point on its curve: its target and figures on replay `p`."""
    target_pct: float | int = int(target) if float(target).is_integer() else target
    return {"target_pct": target_pct, **slo_metrics(view, p.scored_from)}


def held(replicas: Series) -> FloatArray:
    """The replica counts with the last known one held over each gap (and the first
    known one before it)."""
    return np.asarray(pd.Series(replicas.values).ffill().bfill(), dtype=np.float64)


def actual_counts(replicas: Series, ticks: Sequence[float]) -> IntArray:
    """The replicas that ran at each tick (the last read at or before it, held over gaps,
    rounded half to even, at least 1)."""
    counts = held(replicas)
    at = (np.asarray(ticks, dtype=np.float64) - replicas.start) / replicas.step
    values = counts[np.clip(np.floor(at), 0, len(counts) - 1).astype(np.int64)]
    if not np.isfinite(values).all():
        raise ValueError("a replica count read is not finite")
    return np.maximum(1, np.rint(values)).astype(np.int64)


def around_many(
    prepared: Sequence[Prepared],
    replicas: Sequence[Series | None] | None = None,
    baselines: Sequence[str] = tuple(BASELINES),
    reactive: bool = True,
    plot: bool = True,
) -> list[Around]:
    """For each replay (one model): the curves of the baselines named (none: no curves),
    the reactive HPA's run (finished as found, the plot's series kept when `plot`), the
    figures of its `replicas` that ran when given."""
    given = list(replicas) if replicas is not None else [None] * len(prepared)
    runs: list[Swept] = []
    for w, (p, series) in enumerate(zip(prepared, given, strict=True)):
        for n in baselines:
            runs += [Swept(n, w, BASELINES[n], t) for t in sweep_targets()]
        target = scenario_run(p.config).target_pct
        if reactive:
            runs.append(Swept(REACTIVE, w, "hpa_util", target, recorded=plot))
        if series is not None:
            counts = actual_counts(series, p.ticks())
            runs.append(Swept(ACTUAL, w, "hpa_util", target, counts))
    out = [Around({n: [] for n in baselines} if baselines else None, None, None) for _ in prepared]
    for run, view in zip(runs, sweep_views(prepared, runs), strict=True):
        p, found = prepared[run.replay], out[run.replay]
        if run.label == REACTIVE:
            found.reactive = finished(p, "reactive", view, plot=plot)
        elif run.label == ACTUAL:
            mean = round(view.mean_replicas, 2)
            found.actual = {**slo_metrics(view, p.scored_from), "mean_replicas": mean}
        else:
            assert found.curves is not None
            found.curves[run.label].append(point(p, run.target_pct, view))
    return out


def baseline_curves(
    p: Prepared, targets: Sequence[float] | None = None, names: Sequence[str] | None = None
) -> Curves:
    """Every baseline (or those `names`) at every target (default `sweep_targets()`)."""
    chosen = {n: k for n, k in BASELINES.items() if names is None or n in names}
    points = sweep_targets() if targets is None else targets
    runs = [Swept(n, 0, k, float(t)) for n, k in chosen.items() for t in points]
    curves: Curves = {name: [] for name in chosen}
    for run, view in zip(runs, sweep_views([p], runs), strict=True):
        curves[run.label].append(point(p, run.target_pct, view))
    return curves
