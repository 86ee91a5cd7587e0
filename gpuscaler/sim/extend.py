"""Baseline curves extended below their swept targets, so that a policy dearer than the
whole sweep still has an equal-cost point to be compared with."""

from __future__ import annotations

from gpuscaler.sim.around import baseline_curves
from gpuscaler.sim.simulate import Prepared, SimulationResult, run_metrics


def extend_below(sim: SimulationResult, lowest: int = 10, step: int = 5) -> dict[str, list[int]]:
    """Extend each baseline curve of `sim` below its lowest target, `step` points at a
    time down to `lowest` %, until its dearest point holds at least gpuscaler's own
    GPU-hours: where gpuscaler is dearer than the whole swept curve (40..90 %), there is
    no equal-cost point to compare with until the curve reaches it. The points are run
    as the swept ones (same arrivals, seed and cluster model) and added to
    `sim.baselines` in target order; returns the targets added per baseline."""
    gpu_hours = run_metrics(sim, sim.gpuscaler)["gpu_hours"]
    arrivals = sim.gpuscaler.cluster.arrivals
    p = Prepared(
        sim.trace,
        sim.config,
        sim.start,
        sim.seconds,
        arrivals,
        sim.seed,
        sim.scored_from,
        sim.forecast_from,
    )
    added: dict[str, list[int]] = {}
    for name in list(sim.baselines):
        curve = sim.baselines[name]
        while curve and max(pt["gpu_hours"] for pt in curve) < gpu_hours:
            target = min(pt["target_pct"] for pt in curve) - step
            if target < lowest:
                break
            extra = baseline_curves(p, [target], [name])[name][0]
            curve = sorted([*curve, extra], key=lambda pt: pt["target_pct"])
            added.setdefault(name, []).append(target)
        sim.baselines[name] = curve
    return added
