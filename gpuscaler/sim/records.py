"""A simulated run's per-slot record while it runs (`RunView`) and, once it ends, what the
report reads (`RunResult`), so that the record can be let go."""

from __future__ import annotations

import itertools
import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuscaler.core.decisions import Decision
from gpuscaler.core.model import FloatArray, WorkloadObservation
from gpuscaler.sim.equal_cost import equal_cost, reason_outside
from gpuscaler.sim.replay import Prepared

if TYPE_CHECKING:
    from gpuscaler.sim.preemption import SimulatedPreemption

PLOT_MEAN_S = 60.0
"""The PNG draws demand and capacity as means over this many seconds."""
MARKED = ("fragments", "time_slice", "preemption")


@dataclass
class RunView:
    """One run's figures and what it did; a recorded (drawn) run's slots too."""

    start: float
    slot: float
    cursor: int
    """Slots simulated."""
    arrivals: FloatArray
    capacity: FloatArray
    demand_busy: FloatArray
    waits: FloatArray
    """Of a recorded run only: each slot's GPUs' worth ready, work arriving in GPUs busy at
    the current sharing and wait (`load.Waits`)."""
    p99_wait: float
    slo_share: float
    """The requests that waited over the SLO: its figures (`load.Waits`)."""
    gpu_slots: float
    under_share: float
    mean_replicas: float
    """Of the scored slots: GPUs held summed, share under-provisioned, replicas asked mean."""
    replica_changes: Sequence[tuple[float, int, int]]
    fragment_changes: Sequence[Decision] = ()
    time_slice_changes: Sequence[Decision] = ()
    preemption: SimulatedPreemption | None = None


@dataclass
class ForecastTrack:
    """The policy's forecast at the horizon at each tick (origin, mean, band), as doubles:
    what the forecast error and the PNG read."""

    origin: array[float] = field(default_factory=lambda: array("d"))
    mean: array[float] = field(default_factory=lambda: array("d"))
    lower: array[float] = field(default_factory=lambda: array("d"))
    upper: array[float] = field(default_factory=lambda: array("d"))

    def add(self, origin: float, w: WorkloadObservation) -> None:
        f = w.load.forecast
        if f is not None and f.is_finite():
            self.origin.append(origin)
            self.mean.append(f.mean.item(-1))
            self.lower.append(f.lower.item(-1))
            self.upper.append(f.upper.item(-1))


@dataclass(frozen=True)
class Plotted:
    """What the PNG draws of one run."""

    hours: FloatArray
    demand: FloatArray
    capacity: FloatArray
    late: FloatArray
    """Hours into the replay of the slots whose requests wait over the SLO."""
    band: tuple[FloatArray, FloatArray, FloatArray] | None
    """The forecast's band at the horizon: (hours, lower, upper); None: no forecast."""
    marks: tuple[tuple[str, float], ...]
    """(kind, hours) of the fragment, time-slice and preemption decisions."""


@dataclass(frozen=True)
class RunResult:
    """A finished run as the report reads it."""

    policy: str
    metrics: dict[str, Any]
    decisions: list[Decision]
    slot: float
    cursor: int
    plotted: Plotted | None
    """None: finished without its plot (no PNG asked)."""


def finished(
    p: Prepared,
    policy: str,
    view: RunView,
    decisions: list[Decision] | None = None,
    track: ForecastTrack | None = None,
    failed: int = 0,
    plot: bool = True,
) -> RunResult:
    """A run of the replay `p`: its figures, and the plot's series when `plot` (of a
    recorded run)."""
    track = track or ForecastTrack()
    decisions = decisions or []
    forecast_mae, naive_mae = _forecast_errors(p, view, track)
    figures = {
        **slo_metrics(view, p.scored_from),
        "under_provisioned_share": round(view.under_share, 5),
        "forecast_mae": round(forecast_mae, 3) if math.isfinite(forecast_mae) else None,
        "naive_mae": round(naive_mae, 3) if math.isfinite(naive_mae) else None,
        "fragment_changes": len(view.fragment_changes),
        "time_slice_changes": len(view.time_slice_changes),
        "mean_replicas": round(view.mean_replicas, 2),
        "failed_ticks": failed,
        "preemption": None if view.preemption is None else view.preemption.summary(),
    }
    drawn = _plotted(p, view, track, decisions) if plot else None
    return RunResult(policy, figures, decisions, view.slot, view.cursor, drawn)


def _plotted(
    p: Prepared, view: RunView, track: ForecastTrack, decisions: Sequence[Decision]
) -> Plotted:
    n, slot, start = view.cursor, view.slot, p.start
    per = max(1, round(PLOT_MEAN_S / slot))
    m = n // per * per
    hours = (np.arange(m // per) + 1) * per * slot / 3600
    demand = view.demand_busy[:m].reshape(-1, per).mean(axis=1)
    capacity = view.capacity[:m].reshape(-1, per).mean(axis=1)
    slo = p.config.simulator.slo_wait
    late = np.flatnonzero((view.waits[:n] > slo) & (view.arrivals[:n] > 0)) * slot / 3600
    band = None
    if track.origin:
        fx = (np.asarray(track.origin) + p.config.forecast.horizon - start) / 3600
        band = (fx, np.asarray(track.lower) / 100, np.asarray(track.upper) / 100)
    marks = tuple((d.kind, (d.time - start) / 3600) for d in decisions if d.kind in MARKED)
    return Plotted(hours, demand, capacity, late, band, marks)


def slo_metrics(view: RunView, scored_from: int) -> dict[str, Any]:
    """The SLO-true outcome of a run: waits of the requests arriving in the scored part,
    GPU-hours held (a time integral), replica changes and reversals."""
    slot, p99, share = view.slot, view.p99_wait, view.slo_share
    t0 = view.start + scored_from * slot
    directions = [1 if new > old else -1 for t, old, new in view.replica_changes if t >= t0]
    return {
        "slo_violation_share": round(share, 6),
        "p99_wait_s": round(p99, 3),
        "gpu_hours": round(view.gpu_slots * slot / 3600, 3),
        "scaling_actions": len(directions),
        "direction_reversals": sum(1 for a, b in itertools.pairwise(directions) if a != b),
    }


def _forecast_errors(p: Prepared, view: RunView, track: ForecastTrack) -> tuple[float, float]:
    """MAE at the horizon of the policy's forecasts and of the last-value forecast, both
    against the observed demand bucket ending at origin + horizon, over the scored ticks."""
    cfg, slot = p.config.forecast, view.slot
    width = max(1, round(cfg.fit_step / slot))
    bucket = width * slot  # fit_step, or one slot when slots are coarser
    demand = 100.0 * (view.arrivals * p.config.simulator.gpu_seconds_per_request) / slot
    block = demand[: len(demand) // width * width].reshape(-1, width)
    finite = np.isfinite(block)
    with np.errstate(invalid="ignore"):
        sums = np.where(finite, block, 0).sum(1) / finite.sum(1)
    buckets = np.where(finite.any(axis=1), sums, np.nan)
    ahead = round(cfg.horizon / bucket)
    first = p.start + p.scored_from * slot
    origins = np.arange(first, p.start + len(buckets) * bucket, p.config.control.interval)
    idx = np.array([round((t - p.start) / bucket) - 1 for t in origins], dtype=np.int64)
    ok = idx + ahead < len(buckets)
    naive = np.abs(buckets[idx[ok]] - buckets[idx[ok] + ahead])
    naive_mae = float(np.nanmean(naive)) if naive.size else math.nan
    errs = []
    for t, mean in zip(track.origin, track.mean, strict=True):
        b = round((t - p.start) / bucket) - 1 + ahead  # the bucket ending at t + horizon
        if t >= first and b < len(buckets) and math.isfinite(buckets[b]):
            errs.append(abs(mean - buckets[b]))
    forecast_mae = float(np.mean(errs)) if errs else naive_mae  # no forecasts: last value
    return forecast_mae, naive_mae


@dataclass
class SimulationResult:
    """A replay's result: gpuscaler's run, the reactive HPA's, the baselines' curves."""

    p: Prepared
    gpuscaler: RunResult
    reactive: RunResult
    baselines: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        p, g = self.p, self.gpuscaler.metrics
        scored = (self.gpuscaler.cursor - p.scored_from) * self.gpuscaler.slot / 3600
        return {
            "trace": p.trace,
            "hours": round(p.seconds / 3600, 3),
            "scored_hours": round(scored, 3),
            "forecast_from_hours": round(p.forecast_from / 3600, 3),
            "load_model": "utilization derived from request counts (see README)",
            "slo_wait_s": p.config.simulator.slo_wait,
            "gpuscaler": dict(g),
            "reactive": dict(self.reactive.metrics),
            "baselines": self.baselines,
            "equal_cost": {
                name: equal_cost(curve, g["gpu_hours"]) for name, curve in self.baselines.items()
            },
            "equal_cost_outside": {
                name: why
                for name, curve in self.baselines.items()
                if (why := reason_outside(curve, g["gpu_hours"])) is not None
            },
        }
