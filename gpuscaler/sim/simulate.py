"""`gpuscaler simulate`: a trace replayed by the real controller (`lockstep`) and, around
it on the same model, the reactive HPA and the baselines (`sweep`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpuscaler.config import Config
from gpuscaler.sim.equal_cost import BASELINES
from gpuscaler.sim.lockstep import lockstep_runs
from gpuscaler.sim.records import SimulationResult
from gpuscaler.sim.replay import prepare
from gpuscaler.sim.sweep import around_many, baseline_curves
from gpuscaler.sim.trace import Trace

if TYPE_CHECKING:
    from gpuscaler.observability import ControllerMetrics


def simulate(
    trace: Trace,
    hours: float | None,
    seed: int,
    config: Config,
    start_hours: float = 0.0,
    metrics: Sequence[ControllerMetrics] = (),
    baselines: bool = True,
) -> SimulationResult:
    """Replay `hours` of `trace` (all of it when None) from `start_hours` into it."""
    p = prepare(trace, hours, seed, config, start_hours)
    [run] = lockstep_runs([p], metrics=metrics)
    [around] = around_many([p], baselines=tuple(BASELINES) if baselines else ())
    assert around.reactive is not None
    return SimulationResult(p, run, around.reactive, around.curves or {})


def extend_below(sim: SimulationResult, lowest: int = 10, step: int = 5) -> dict[str, list[int]]:
    """Extend each baseline curve below its lowest target, `step` points at a time down to
    `lowest` %, until its dearest point holds at least gpuscaler's GPU-hours and violates
    the SLO no more than gpuscaler: a policy dearer or better than the whole swept curve
    has no equal-cost (equal-SLO) point until the curve reaches it. The points run as the
    swept ones; returns the targets added per baseline."""
    gpu_hours = sim.gpuscaler.metrics["gpu_hours"]
    share = sim.gpuscaler.metrics["slo_violation_share"]
    added: dict[str, list[int]] = {}
    for name in list(sim.baselines):
        curve = sim.baselines[name]
        while curve and (
            max(pt["gpu_hours"] for pt in curve) < gpu_hours
            or min(pt["slo_violation_share"] for pt in curve) > share
        ):
            target = min(pt["target_pct"] for pt in curve) - step
            if target < lowest:
                break
            extra = baseline_curves(sim.p, [target], [name])[name][0]
            curve = sorted([*curve, extra], key=lambda pt: pt["target_pct"])
            added.setdefault(name, []).append(target)
        sim.baselines[name] = curve
    return added
