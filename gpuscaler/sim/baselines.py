"""The reactive baselines swept over their targets, of one replay or of many at once.

Every baseline (`equal_cost.BASELINES`: the HPA on utilization, KEDA on request rate, the
predictive floor) at every swept target, as `gpuscaler.sim.sweep` runs them: all runs of
one replay in one sweep, and the runs of several replays that share a model
(`sweep.same_model`: the same range, slots, settings, fragments and noise, as the what-if
replays of one lockstep do) in one sweep too, each run on its own replay's arrivals and
replica bounds. A run's figures do not depend on the runs beside it (tests/test_sweep.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuscaler.config import Config
from gpuscaler.sim.cluster import SimulatedCluster
from gpuscaler.sim.equal_cost import BASELINES, sweep_targets
from gpuscaler.sim.queue import slo_figures
from gpuscaler.sim.scalers import IntArray, ScalerKind
from gpuscaler.sim.sweep import SweepResult, sweep_parts

Curves = dict[str, list[dict[str, Any]]]
"""Per baseline, its figures at each swept target (`simulate.slo_figures` + target_pct)."""


@dataclass(frozen=True)
class Extra:
    """A run of replay `replay` swept beside the baselines with its whole record kept: a
    scaler (`kind` at `target_pct`, as the reactive HPA), or with `replicas` given, no
    scaler: the replicas set to `replicas[k]` at the kth control tick."""

    replay: int
    kind: ScalerKind
    target_pct: float
    replicas: IntArray | None = None


def swept(
    config: Config,
    replays: Sequence[tuple[SimulatedCluster, int]],
    seed: int,
    seconds: float,
    targets: Sequence[float] | None = None,
    names: Sequence[str] | None = None,
    budget: int | None = None,
) -> list[Curves]:
    """The curves of each replay (its template cluster, its first scored slot): every
    baseline (or those `names`) at every target (default `sweep_targets()`), all runs of
    all replays in one sweep (in groups within `budget` bytes, default SWEEP_BYTES, each
    group's figures taken before the next runs). The replays must share the first one's
    model."""
    choice = {"targets": targets, "names": names, "budget": budget}
    return swept_with(config, replays, seed, seconds, (), **choice)[0]


def swept_with(
    config: Config,
    replays: Sequence[tuple[SimulatedCluster, int]],
    seed: int,
    seconds: float,
    extra: Sequence[Extra],
    **choice: Any,
) -> tuple[list[Curves], list[SweepResult], int]:
    """`swept` (`choice`: its `targets`, `names` and `budget`), with the runs `extra` in
    the same sweep: (the curves, the extra runs' results, each with its recorder, the
    slots simulated)."""
    targets, names = choice.get("targets"), choice.get("names")
    slo = config.simulator.slo_wait
    points = list(sweep_targets() if targets is None else targets)
    chosen = {n: k for n, k in BASELINES.items() if names is None or n in names}
    specs = [(name, kind, t) for name, kind in chosen.items() for t in points]
    flat = [(w, spec) for w in range(len(replays)) for spec in specs]
    runs: list[tuple[ScalerKind, float]] = [(kind, float(t)) for _, (_, kind, t) in flat]
    runs += [(e.kind, e.target_pct) for e in extra]
    rows = [replays[w][0] for w, _ in flat] + [replays[e.replay][0] for e in extra]
    given = {len(flat) + j: e.replicas for j, e in enumerate(extra) if e.replicas is not None}
    record = range(len(flat), len(runs))
    out: list[Curves] = [{name: [] for name in chosen} for _ in replays]
    kept: list[SweepResult] = []
    slots = 0
    template = replays[0][0]
    budget = choice.get("budget")
    parts = sweep_parts(config, template, runs, seed, seconds, rows, budget, record, given)
    for first, results, n in parts:
        slots = n
        for i, r in enumerate(results, first):
            if i >= len(flat):
                kept.append(r)
                continue
            w, (name, _, target) = flat[i]
            out[w][name].append({"target_pct": target, **_figures(replays[w], r, n, slo)})
        del results, r  # the group's arrays go before the next group is built (never empty)
    return out, kept, slots


def _figures(
    replay: tuple[SimulatedCluster, int], r: SweepResult, n: int, slo: float
) -> dict[str, Any]:
    c, scored = replay
    run = (c.work[:n], r.served[:n], r.gpus[:n], r.replica_changes)
    return slo_figures(run, c.arrivals[:n], c.slot, c.start, scored, slo)
