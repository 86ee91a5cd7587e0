"""A replay of a load trace: its range and arrivals checked (`prepare`), what is kept of
each run (`RunResult`), and the figures reported of them (`SimulationResult`). The runs
themselves are `gpuscaler.sim.lockstep` (the real controller) and `gpuscaler.sim.sweep`
(the reactive HPA and the baselines), on one model (`gpuscaler.sim.cluster`)."""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuscaler.config import Config, NodePoolConfig, WorkloadConfig
from gpuscaler.controller import TickResult
from gpuscaler.core.decisions import Decision
from gpuscaler.core.model import FloatArray, WorkloadObservation
from gpuscaler.sim.equal_cost import equal_cost, reason_outside
from gpuscaler.sim.kept import Kept, plotted
from gpuscaler.sim.load import arrivals_from_trace
from gpuscaler.sim.queue import slo_figures
from gpuscaler.sim.records import RunView
from gpuscaler.sim.trace import Trace, TraceError

DEFAULT_POOL = NodePoolConfig(
    name="a100-80gb",
    selector={"label": "nvidia.com/gpu.product", "value": "NVIDIA-A100-SXM4-80GB"},
    gpu_memory_gib=80,
    workload_type="inference",
    profile="compute_bound",
    initial_fragments=2,
)
DEFAULT_WORKLOAD = WorkloadConfig(
    namespace="default",
    kind="ScaledObject",
    name="llm-chat",
    type="inference",
    node_pool="a100-80gb",
    # Replica counts scale with fragments (8 fragments: 8 replicas a GPU).
    overrides={"replicas": {"max_replicas": 200}},
)


def scenario_config(config: Config) -> Config:
    """The config with a workload and its pool to simulate: the first configured workload
    that names a pool, or the built-in scenario when there is none."""
    if any(w.node_pool for w in config.workloads):
        return config
    return config.model_copy(
        update={
            "node_pools": (*config.node_pools, DEFAULT_POOL),
            "workloads": (*config.workloads, DEFAULT_WORKLOAD),
        }
    )


def _doubles() -> array[float]:
    return array("d")


@dataclass
class ForecastTrack:
    """The policy's forecast at the horizon at each tick (its origin, mean and band): what
    the forecast error and the PNG read, as doubles (a week is 20,160 ticks a run)."""

    origin: array[float] = field(default_factory=_doubles)
    mean: array[float] = field(default_factory=_doubles)
    lower: array[float] = field(default_factory=_doubles)
    upper: array[float] = field(default_factory=_doubles)

    def add(self, result: TickResult) -> None:
        for w in result.snapshot.workloads:
            self.add_workload(result.plan.time, w)

    def add_workload(self, origin: float, w: WorkloadObservation) -> None:
        f = w.load.forecast
        if f is None or not f.is_finite():
            return
        self.origin.append(origin)
        self.mean.append(f.mean.item(-1))
        self.lower.append(f.lower.item(-1))
        self.upper.append(f.upper.item(-1))


@dataclass
class RunResult:
    policy: str
    cluster: RunView
    """The run's record (empty once released)."""
    decisions: list[Decision]
    track: ForecastTrack
    failed_ticks: int
    kept: Kept | None = None
    """What the report reads of it, when its record was let go (`release`)."""

    def span(self) -> tuple[float, int]:
        """(slot seconds, slots run)."""
        if self.kept is not None:
            return self.kept.slot, self.kept.cursor
        return self.cluster.slot, self.cluster.cursor


@dataclass
class SimulationResult:
    trace: str
    hours: float
    start: float
    scored_from: int
    """First scored sample (after the warm-up)."""
    gpuscaler: RunResult
    reactive: RunResult
    config: Config
    baselines: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    forecast_from: float = 0.0
    """Seconds into the replay from which the forecast ran (before, the controller's
    floor sized for the observed demand alone)."""
    seconds: float = 0.0
    """Seconds replayed (`hours` unrounded)."""
    seed: int = 1

    def summary(self) -> dict[str, Any]:
        g = run_metrics(self, self.gpuscaler)
        slot, cursor = self.gpuscaler.span()
        scored = (cursor - self.scored_from) * slot / 3600
        return {
            "trace": self.trace,
            "hours": self.hours,
            "scored_hours": round(scored, 3),
            "forecast_from_hours": round(self.forecast_from / 3600, 3),
            "load_model": "utilization derived from request counts (see README)",
            "slo_wait_s": self.config.simulator.slo_wait,
            "gpuscaler": g,
            "reactive": run_metrics(self, self.reactive),
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


def _bucket_means(values: FloatArray, width: int) -> FloatArray:
    usable = len(values) // width * width
    block = values[:usable].reshape(-1, width)
    finite = np.isfinite(block)
    with np.errstate(invalid="ignore"):
        return np.where(
            finite.any(axis=1), np.where(finite, block, 0).sum(1) / finite.sum(1), np.nan
        )


def _forecast_errors(
    config: Config, start: float, scored_from: int, run: RunResult
) -> tuple[float, float]:
    """MAE at the horizon of the policy's forecasts and of the last-value forecast, both
    against the observed demand bucket ending at origin + horizon, over the scored ticks."""
    cfg = config.forecast
    slot = run.cluster.slot
    width = max(1, round(cfg.fit_step / slot))
    bucket = width * slot  # fit_step, or one slot when slots are coarser
    buckets = _bucket_means(run.cluster.rec.demand_pct, width)
    ahead = round(cfg.horizon / bucket)

    def bucket_at(t: float) -> int:
        return round((t - start) / bucket) - 1  # the bucket ending at t

    first = start + scored_from * slot
    origins = np.arange(first, start + len(buckets) * bucket, config.control.interval)
    idx = np.array([bucket_at(t) for t in origins], dtype=np.int64)
    ok = idx + ahead < len(buckets)
    naive = np.abs(buckets[idx[ok]] - buckets[idx[ok] + ahead])
    naive_mae = float(np.nanmean(naive)) if naive.size else math.nan
    errs = []
    for t, mean in zip(run.track.origin, run.track.mean, strict=True):
        b = bucket_at(t) + ahead
        if t >= first and b < len(buckets) and math.isfinite(buckets[b]):
            errs.append(abs(mean - buckets[b]))
    forecast_mae = float(np.mean(errs)) if errs else naive_mae  # no forecasts: last value
    return forecast_mae, naive_mae


def slo_metrics(cluster: RunView, scored_from: int, slo: float) -> dict[str, Any]:
    """The SLO-true outcome of one run: waits of the requests arriving in the scored
    part, GPU-hours held (time integral), replica changes and reversals."""
    n = cluster.cursor
    rec = cluster.rec
    run = (cluster.work[:n], rec.served[:n], rec.gpus[:n], cluster.replica_changes)
    return slo_figures(run, rec.requests[:n], cluster.slot, cluster.start, scored_from, slo)


def run_metrics(sim: SimulationResult, run: RunResult) -> dict[str, Any]:
    """The figures of one run of the replay (kept ones when it was released)."""
    if run.kept is not None:
        return dict(run.kept.metrics)
    return run_figures(sim.config, sim.start, sim.scored_from, run)


def run_figures(config: Config, start: float, scored_from: int, run: RunResult) -> dict[str, Any]:
    """The figures of one run of a replay from `start`, scored from slot `scored_from`."""
    rec = run.cluster.rec
    s = slice(scored_from, run.cluster.cursor)
    under = rec.demand_busy[s] > rec.capacity[s] + 1e-9
    forecast_mae, naive_mae = _forecast_errors(config, start, scored_from, run)
    return {
        **slo_metrics(run.cluster, scored_from, config.simulator.slo_wait),
        "under_provisioned_share": round(float(under.mean()), 5),
        "forecast_mae": round(forecast_mae, 3) if math.isfinite(forecast_mae) else None,
        "naive_mae": round(naive_mae, 3) if math.isfinite(naive_mae) else None,
        "fragment_changes": len(run.cluster.fragment_changes),
        "time_slice_changes": len(run.cluster.time_slice_changes),
        "mean_replicas": round(float(np.mean(rec.replicas[s])), 2),
        "failed_ticks": run.failed_ticks,
        "preemption": run.cluster.preemption.summary()
        if run.cluster.preemption is not None and run.policy == "gpuscaler"
        else None,
    }


@dataclass(frozen=True, eq=False)
class Prepared:
    """A replay checked and ready to run: its config, range and arrivals."""

    trace: str
    config: Config
    start: float
    seconds: float
    arrivals: FloatArray
    seed: int
    scored_from: int
    forecast_from: float


def prepare(
    trace: Trace, hours: float | None, seed: int, config: Config, start_hours: float = 0.0
) -> Prepared:
    """`hours` of `trace` (all of it when None) from `start_hours` into it, checked."""
    config = scenario_config(config)
    slot_problem(config, trace.name)
    offset = start_hours * 3600.0
    available = trace.duration - offset
    seconds = available if hours is None else hours * 3600.0
    if offset < 0 or seconds > available + 1e-9:
        raise TraceError(
            f"{trace.name}: {seconds / 3600:g} h from hour {start_hours:g} asked, the trace "
            f"holds {trace.duration / 3600:.2f} h"
        )
    scored_from, forecast_from = warmup_plan(config, seconds, trace.name)
    start = trace.start + offset
    arrivals = arrivals_from_trace(trace, start, seconds, seed, config.simulator.slot)
    return Prepared(trace.name, config, start, seconds, arrivals, seed, scored_from, forecast_from)


def release(p: Prepared, run: RunResult, plot: bool = True) -> RunResult:
    """`run` with what the report reads of it kept (its figures, and its plot when
    `plot`) and its record let go: the same summary and PNG."""
    figures = run_figures(p.config, p.start, p.scored_from, run)
    c, t = run.cluster, run.track
    drawn = None
    if plot:
        band = (t.origin, t.lower, t.upper)
        cfg = p.config
        drawn = plotted(
            c, band, run.decisions, p.start, cfg.simulator.slo_wait, cfg.forecast.horizon
        )
    kept = Kept(figures, c.slot, c.cursor, drawn)
    return RunResult(
        run.policy, c.emptied(), run.decisions, ForecastTrack(), run.failed_ticks, kept
    )


def finish(
    p: Prepared,
    gpuscaler: RunResult,
    reactive: RunResult,
    curves: dict[str, list[dict[str, Any]]] | None,
) -> SimulationResult:
    """The replay's result: gpuscaler's run, the reactive HPA's and the baselines'
    curves (None: not swept)."""
    return SimulationResult(
        trace=p.trace,
        hours=round(p.seconds / 3600, 3),
        start=p.start,
        scored_from=p.scored_from,
        gpuscaler=gpuscaler,
        reactive=reactive,
        config=p.config,
        baselines=curves or {},
        forecast_from=p.forecast_from,
        seconds=p.seconds,
        seed=p.seed,
    )


MIN_SECONDS = 1800.0
"""Shortest replay: 30 minutes."""


def warmup_plan(config: Config, seconds: float, name: str) -> tuple[int, float]:
    """(first scored sample, seconds before the controller starts). A replay long enough
    for one metrics window plus the horizon is scored after that window; a shorter one
    (at least 30 minutes and min_history plus the horizon) is scored after min_history,
    the reactive autoscaler alone running until then."""
    window, horizon = config.metrics.window, config.forecast.horizon
    min_history, slot = config.forecast.min_history, config.simulator.slot
    if seconds >= window + horizon + config.control.interval:
        return int(window / slot), min_history
    needed = max(MIN_SECONDS, min_history + horizon)
    if seconds < needed - 1e-9:
        # Below 30 minutes no setting helps; above it, a shorter history or horizon does.
        remedy = (
            f"supply at least {MIN_SECONDS / 60:.0f} min of trace (the shortest replay)"
            if seconds < MIN_SECONDS
            else f"supply at least {needed / 60:.0f} min of trace, or set forecast.min_history "
            f"to at most {(seconds - horizon) / 60:.0f} min (or forecast.horizon lower)"
        )
        raise TraceError(
            f"{name}: {seconds / 60:.1f} min is shorter than one forecast window "
            f"({needed / 60:.0f} min: forecast.min_history "
            f"{min_history / 60:g} min + horizon {horizon / 60:g} min, at least 30 min); "
            f"{remedy}"
        )
    return int(min_history / slot), min_history


def slot_problem(config: Config, name: str) -> None:
    """Raise TraceError when `simulator.slot` is coarser than what the controller reads:
    the forecaster refuses samples coarser than forecast.fit_step, and a control tick
    must see at least one new slot."""
    slot, fit_step = config.simulator.slot, config.forecast.fit_step
    limit = min(fit_step, config.control.interval)
    if slot > limit + 1e-9:
        raise TraceError(
            f"{name}: simulator.slot {slot:g}s is coarser than forecast.fit_step "
            f"({fit_step:g}s) or control.interval ({config.control.interval:g}s); "
            f"use a slot of at most {limit:g}s"
        )
