"""The reactive baselines swept over their targets, of one replay or of many at once.

Every baseline (`equal_cost.BASELINES`: the HPA on utilization, KEDA on request rate, the
predictive floor) at every swept target, as `gpuscaler.sim.sweep` runs them: all runs of
one replay in one sweep, and the runs of several replays that share a model
(`sweep.same_model`: the same range, slots, settings, fragments and noise, as the what-if
replays of one lockstep do) in one sweep too, each run on its own replay's arrivals and
replica bounds. A run's figures do not depend on the runs beside it (tests/test_sweep.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuscaler.config import Config
from gpuscaler.sim.cluster import SimulatedCluster
from gpuscaler.sim.equal_cost import BASELINES, sweep_targets
from gpuscaler.sim.queue import slo_figures
from gpuscaler.sim.scalers import IntArray, ScalerKind
from gpuscaler.sim.sweep_groups import sweep_parts
from gpuscaler.sim.swept import SweepResult

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
    return swept_with(config, replays, seed, seconds, (), None, **choice)[0]


def swept_with(
    config: Config,
    replays: Sequence[tuple[SimulatedCluster, int]],
    seed: int,
    seconds: float,
    extra: Sequence[Extra],
    done: Callable[[int, SweepResult, int], None] | None = None,
    **choice: Any,
) -> tuple[list[Curves], list[SweepResult], int]:
    """`swept` (`choice`: its `targets`, `names` and `budget`), with the runs `extra` in
    the same sweep: (the curves, the extra runs' results, each with its recorder, the
    slots simulated). Each replay's extra runs follow its baselines' runs, so a group
    holds the records of its own replays' extra runs only; with `done`, each extra run's
    result is handed to it (`done(j, result, slots)`, j its index in `extra`) as soon as
    its group ends, and not returned (the list is empty)."""
    targets, names = choice.get("targets"), choice.get("names")
    slo = config.simulator.slo_wait
    points = list(sweep_targets() if targets is None else targets)
    chosen = {n: k for n, k in BASELINES.items() if names is None or n in names}
    specs = [(name, kind, t) for name, kind in chosen.items() for t in points]
    order: list[tuple[int, tuple[str, ScalerKind, float] | Extra, int]] = []
    for w in range(len(replays)):  # (replay, baseline or extra run, index in extra)
        order += [(w, spec, -1) for spec in specs]
        order += [(w, e, j) for j, e in enumerate(extra) if e.replay == w]
    runs: list[tuple[ScalerKind, float]] = [
        (x.kind, x.target_pct) if isinstance(x, Extra) else (x[1], float(x[2])) for _, x, _ in order
    ]
    rows = [replays[w][0] for w, _, _ in order]
    given = {i: x.replicas for i, (_, x, _) in enumerate(order) if isinstance(x, Extra)}
    record = [i for i, (_, x, _) in enumerate(order) if isinstance(x, Extra)]
    replicas = {i: v for i, v in given.items() if v is not None}
    out: list[Curves] = [{name: [] for name in chosen} for _ in replays]
    kept: dict[int, SweepResult] = {}
    slots = 0
    template = replays[0][0]
    budget = choice.get("budget")
    parts = sweep_parts(config, template, runs, seed, seconds, rows, budget, record, replicas)
    for first, results, n in parts:
        slots = n
        for (w, x, j), r in zip(order[first:], results, strict=False):
            if isinstance(x, Extra):
                kept[j] = r
                continue
            name, _, target = x
            out[w][name].append({"target_pct": target, **_figures(replays[w], r, n, slo)})
        if done is not None:
            for j in sorted(kept):
                done(j, kept.pop(j), n)
        del results, r  # the group's arrays go before the next group is built (never empty)
    return out, [] if done is not None else [kept[j] for j in range(len(extra))], slots


def _figures(
    replay: tuple[SimulatedCluster, int], r: SweepResult, n: int, slo: float
) -> dict[str, Any]:
    c, scored = replay
    run = (c.work[:n], r.served[:n], r.gpus[:n], r.replica_changes)
    return slo_figures(run, c.arrivals[:n], c.slot, c.start, scored, slo)
