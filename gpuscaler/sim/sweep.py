"""Runs without a controller, many at once: the baselines swept over their targets, the
reactive HPA, and the replicas that actually ran, each one run of the simulated cluster's
model (`gpuscaler.sim.cluster.Clusters`), all of a group stepped together.

A sweep runs the replays that share a model (`same_model`: one range, seed, slots and
settings) together, each run on its own replay's arrivals and replica bounds; a run's
figures do not depend on the runs beside it. The runs go in groups within a memory budget
(`RUN_SLOT_BYTES` a run a slot): the fewest groups the budget allows, of even sizes, one
group's arrays at a time.

What a sweep's runs leave out, because no controller runs in them: the controller's
floor (min_replicas throughout), fragment changes (the pool's initial fragments
throughout) and the pool's signals. The request rate and the predictive floor's forecast
read the arrivals alone, which no run changes: they are computed once for every tick.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuscaler.core.model import FloatArray
from gpuscaler.sim.cluster import Clusters, scenario_run
from gpuscaler.sim.equal_cost import BASELINES, sweep_targets
from gpuscaler.sim.records import RunView
from gpuscaler.sim.scalers import IntArray, ScalerKind, predicted_loads, rate_loads
from gpuscaler.sim.simulate import Prepared, slo_metrics
from gpuscaler.sim.ticks import control_ticks

RUN_SLOT_BYTES = 8 + 4
"""What every run of a sweep records a slot: the work served (float64) and the GPUs held
(float32)."""
SWEEP_BYTES = 256 * 2**20
"""Memory the recorded arrays of one sweep may take by default: a longer replay runs its
runs in groups."""

Curves = dict[str, list[dict[str, Any]]]
"""Per baseline, its figures at each swept target (`simulate.slo_metrics` + target_pct)."""


@dataclass(frozen=True)
class Swept:
    """A run of replay `replay` in a sweep: a scaler (`kind` at `target_pct`), or with
    `replicas` given, no scaler: the replicas set to `replicas[k]` at the kth control
    tick. `recorded`: its whole record kept (a reactive run's plot, its full figures)."""

    replay: int
    kind: ScalerKind
    target_pct: float
    replicas: IntArray | None = None
    recorded: bool = False


def same_model(a: Prepared, b: Prepared) -> bool:
    """Whether replays `a` and `b` can share a sweep: the same range, seed, slots and
    simulator settings, arrivals of their own."""
    ca, cb = a.config, b.config
    return (
        (a.start, a.seconds, a.seed, len(a.arrivals))
        == (b.start, b.seconds, b.seed, len(b.arrivals))
        and ca.simulator == cb.simulator
        and ca.control.interval == cb.control.interval
        and ca.forecast.horizon == cb.forecast.horizon
        and ca.metrics.window == cb.metrics.window
    )


def group_size(runs: int, slots: int, budget: int | None = None) -> int:
    """Runs a group of a sweep of `runs` runs of `slots` slots within `budget` bytes
    (SWEEP_BYTES): as few groups as fit, of one size (the last one may be smaller)."""
    most = max(1, (SWEEP_BYTES if budget is None else budget) // (RUN_SLOT_BYTES * max(1, slots)))
    groups = max(1, math.ceil(runs / most))
    return max(1, math.ceil(runs / groups))


def sweep_groups(
    replays: Sequence[Prepared], runs: Sequence[Swept], budget: int | None = None
) -> Iterator[tuple[int, list[RunView]]]:
    """Every run of `runs` (on replays that share a model), in groups within `budget`
    bytes, one group at a time: (the group's first run, its runs' records)."""
    group = group_size(len(runs), len(replays[0].arrivals), budget)
    for i in range(0, len(runs), group):
        yield i, sweep_views(replays, runs[i : i + group])


def sweep_views(replays: Sequence[Prepared], runs: Sequence[Swept]) -> list[RunView]:
    """Every run of `runs` stepped together over the replays' range: at each control
    tick, the slots up to it, then every run's scaler."""
    if any(not same_model(replays[0], replays[r.replay]) for r in runs):
        raise ValueError("a sweep's replays must share one model (`same_model`)")
    used = sorted({r.replay for r in runs})
    member = {replay: m for m, replay in enumerate(used)}
    specs = [
        scenario_run(
            replays[r.replay].config,
            member[r.replay],
            r.target_pct,
            uses_util=r.kind != "keda_rate",
            recorded=r.recorded,
        )
        for r in runs
    ]
    p = replays[used[0]]
    arrivals = np.stack([replays[u].arrivals for u in used])
    clusters = Clusters(p.config, arrivals, p.start, p.seed, specs)
    ticks = control_ticks(p.start, p.seconds, p.config.control.interval)
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
    predictive floor's forecast; NaN: none), computed for every tick at once from each
    replay's arrivals; None when no run reads one."""
    kinds = [r.kind for r in runs]
    if not any(k in ("keda_rate", "predictive_floor") for k in kinds):
        return None
    slot, n = clusters.slot, clusters.n
    steps = np.round((np.asarray(ticks) - clusters.start) / slot).astype(np.int64)
    cursors = np.maximum.accumulate(np.minimum(n, np.maximum(steps, 0)))
    gps = clusters.sim.gpu_seconds_per_request
    horizon = p.config.forecast.horizon
    arrivals = clusters.arrivals
    m = len(arrivals)
    rates = [rate_loads(a, cursors, slot, gps) for a in arrivals] if "keda_rate" in kinds else []
    predicted = (
        [predicted_loads(100.0 * (a * gps) / slot, cursors, slot, horizon) for a in arrivals]
        if "predictive_floor" in kinds
        else []
    )
    none = np.full(len(ticks), np.nan)
    table = np.stack([*(rates or [none] * m), *(predicted or [none] * m), none], axis=1)
    column = {"keda_rate": 0, "predictive_floor": m}
    cols = np.array(
        [column[k] + w if k in column else 2 * m for k, w in zip(kinds, members, strict=True)]
    )

    def at(k: int) -> FloatArray:
        return np.asarray(table[k, cols])

    return at


def baseline_runs(
    replay: int, targets: Sequence[float] | None = None, names: Sequence[str] | None = None
) -> list[tuple[str, Swept]]:
    """Every baseline (or those `names`) at every target (default `sweep_targets()`) of
    replay `replay`: (baseline name, its run)."""
    points = list(sweep_targets() if targets is None else targets)
    chosen = {n: k for n, k in BASELINES.items() if names is None or n in names}
    return [(name, Swept(replay, kind, float(t))) for name, kind in chosen.items() for t in points]


def point(p: Prepared, target: float, view: RunView) -> dict[str, Any]:
    """A baseline's point on its curve: its target and figures on replay `p`."""
    target_pct: float | int = int(target) if float(target).is_integer() else target
    return {
        "target_pct": target_pct,
        **slo_metrics(view, p.scored_from, p.config.simulator.slo_wait),
    }
