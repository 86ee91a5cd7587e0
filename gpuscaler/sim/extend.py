"""Baseline curves extended below their swept targets, so that a policy dearer than the
whole sweep still has an equal-cost point to be compared with (issue 11)."""

from __future__ import annotations

from gpuscaler.sim.simulate import SimulationResult, run_baselines, run_metrics


def extend_below(sim: SimulationResult, lowest: int = 10, step: int = 5) -> dict[str, list[int]]:
    """Extend each baseline curve of `sim` below its lowest target, `step` points at a
    time down to `lowest` %, until its dearest point holds at least gpuscaler's own
    GPU-hours: where gpuscaler is dearer than the whole swept curve (40..90 %), there is
    no equal-cost point to compare with until the curve reaches it. The points are run
    as the swept ones (same arrivals, seed and cluster model) and added to
    `sim.baselines` in target order; returns the targets added per baseline."""
    gpu_hours = run_metrics(sim, sim.gpuscaler)["gpu_hours"]
    run = sim.gpuscaler.cluster
    added: dict[str, list[int]] = {}
    for name in list(sim.baselines):
        curve = sim.baselines[name]
        while curve and max(p["gpu_hours"] for p in curve) < gpu_hours:
            target = min(p["target_pct"] for p in curve) - step
            if target < lowest:
                break
            args = (sim.config, sim.start, sim.seconds, run.arrivals, sim.seed, sim.scored_from)
            point = run_baselines(*args, [target], [name])[name][0]
            curve = sorted([*curve, point], key=lambda p: p["target_pct"])
            added.setdefault(name, []).append(target)
        sim.baselines[name] = curve
    return added
