"""Replay a load trace through the real controller against the simulated cluster, and
through a reactive HPA baseline on the same trace; report both."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuscaler.config import Config, NodePoolConfig, WorkloadConfig
from gpuscaler.controller import Controller, TickResult
from gpuscaler.core.model import Decision, FloatArray
from gpuscaler.sim.cluster import SAMPLE, SimulatedCluster, demand_from_trace
from gpuscaler.sim.trace import Trace, TraceError

if TYPE_CHECKING:
    from gpuscaler.observability import ControllerMetrics

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


def scenario_cluster(
    config: Config, demand: FloatArray, start: float, seed: int
) -> SimulatedCluster:
    """The simulated cluster for the first workload with a node pool, at that pool's
    initial fragments."""
    workload = next(w for w in config.workloads if w.node_pool)
    pool = next(p for p in config.node_pools if p.name == workload.node_pool)
    fragments = pool.initial_fragments or config.fragments.allowed[0]
    return SimulatedCluster(config, workload.key, pool.name, demand, start, seed, fragments)


@dataclass
class ForecastTrack:
    origin: list[float] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    last: list[float] = field(default_factory=list)

    def add(self, result: TickResult) -> None:
        for w in result.snapshot.workloads:
            f = w.load.forecast
            if f is None or not f.is_finite():
                continue
            self.origin.append(result.plan.time)
            self.mean.append(float(f.mean[-1]))
            self.lower.append(float(f.lower[-1]))
            self.upper.append(float(f.upper[-1]))
            self.last.append(f.last_value)


@dataclass
class RunResult:
    policy: str
    cluster: SimulatedCluster
    decisions: list[Decision]
    track: ForecastTrack
    failed_ticks: int


@dataclass
class SimulationResult:
    trace: str
    hours: float
    start: float
    scored_from: int
    """First scored sample (after the warm-up of one metrics window)."""
    gpuscaler: RunResult
    reactive: RunResult
    config: Config

    def summary(self) -> dict[str, Any]:
        return {
            "trace": self.trace,
            "hours": self.hours,
            "load_model": "utilization derived from request counts (see README)",
            "gpuscaler": _metrics(self, self.gpuscaler),
            "reactive": _metrics(self, self.reactive),
        }


def _bucket_means(values: FloatArray, width: int) -> FloatArray:
    usable = len(values) // width * width
    block = values[:usable].reshape(-1, width)
    finite = np.isfinite(block)
    with np.errstate(invalid="ignore"):
        return np.where(
            finite.any(axis=1), np.where(finite, block, 0).sum(1) / finite.sum(1), np.nan
        )


def _forecast_errors(sim: SimulationResult, run: RunResult) -> tuple[float, float]:
    """MAE at the horizon of the policy's forecasts and of the last-value forecast, both
    against the observed load bucket ending at origin + horizon, over the scored ticks."""
    cfg = sim.config.forecast
    width = round(cfg.fit_step / SAMPLE)
    buckets = _bucket_means(run.cluster.rec.load, width)
    ahead = round(cfg.horizon / cfg.fit_step)

    def bucket_at(t: float) -> int:
        return round((t - sim.start) / cfg.fit_step) - 1  # the bucket ending at t

    first = sim.start + sim.scored_from * SAMPLE
    origins = np.arange(first, sim.start + len(buckets) * cfg.fit_step, sim.config.control.interval)
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


def _metrics(sim: SimulationResult, run: RunResult) -> dict[str, Any]:
    rec = run.cluster.rec
    s = slice(sim.scored_from, run.cluster.cursor)
    under = rec.demand_busy[s] > rec.capacity[s] + 1e-9
    changes = [
        c for c in run.cluster.replica_changes if (c[0] - sim.start) / SAMPLE >= sim.scored_from
    ]
    directions = [1 if new > old else -1 for _, old, new in changes]
    reversals = sum(1 for a, b in itertools.pairwise(directions) if a != b)
    forecast_mae, naive_mae = _forecast_errors(sim, run)
    return {
        "under_provisioned_share": round(float(under.mean()), 5),
        "gpu_hours": round(float(np.nansum(rec.gpus[s]) * SAMPLE / 3600), 2),
        "scaling_actions": len(changes),
        "direction_reversals": reversals,
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


def _run(
    policy: str,
    config: Config,
    trace: Trace,
    start: float,
    seconds: float,
    demand: FloatArray,
    seed: int,
    metrics: Sequence[ControllerMetrics] = (),
) -> RunResult:
    cluster = scenario_cluster(config, demand, start, seed)
    track = ForecastTrack()
    decisions: list[Decision] = []
    controller = Controller(config, cluster, cluster, dry_run=False, log_decisions=False)

    def listen(result: TickResult) -> None:
        track.add(result)
        decisions.extend(result.applied)

    controller.stats.listeners.append(listen)
    if policy == "gpuscaler":
        for m in metrics:
            m.attach(controller)
    interval = config.control.interval
    warmup = config.forecast.min_history
    t = start + interval
    end = start + seconds
    while t <= end:
        cluster.advance_to(t)
        cluster.hpa_step(t)
        if policy == "gpuscaler" and t - start >= warmup:
            controller.safe_tick(t)
        t += interval
    cluster.advance_to(end)
    return RunResult(policy, cluster, decisions, track, controller.stats.failed)


def simulate(
    trace: Trace,
    hours: float | None,
    seed: int,
    config: Config,
    start_hours: float = 0.0,
    metrics: Sequence[ControllerMetrics] = (),
) -> SimulationResult:
    """Replay `hours` of `trace` (all of it when None) from `start_hours` into it."""
    config = scenario_config(config)
    offset = start_hours * 3600.0
    available = trace.duration - offset
    seconds = available if hours is None else hours * 3600.0
    needed = config.metrics.window + config.forecast.horizon + config.control.interval
    if offset < 0 or seconds > available + 1e-9:
        raise TraceError(
            f"{trace.name}: {seconds / 3600:g} h from hour {start_hours:g} asked, the trace "
            f"holds {trace.duration / 3600:.2f} h"
        )
    if seconds < needed:
        raise TraceError(
            f"{trace.name}: {seconds / 3600:.2f} h is shorter than one forecast window "
            f"({needed / 3600:.2f} h: metrics window + horizon + one interval)"
        )
    start = trace.start + offset
    demand = demand_from_trace(
        trace, start, seconds, config.simulator.gpu_seconds_per_request, seed
    )
    runs = {
        policy: _run(policy, config, trace, start, seconds, demand, seed, metrics)
        for policy in ("gpuscaler", "reactive")
    }
    return SimulationResult(
        trace=trace.name,
        hours=round(seconds / 3600, 3),
        start=start,
        scored_from=int(config.metrics.window / SAMPLE),
        gpuscaler=runs["gpuscaler"],
        reactive=runs["reactive"],
        config=config,
    )
