"""Observation sources of the controller: Prometheus' metrics joined with what the
cluster runs now. Each adapter speaks to its one system (`adapters.prometheus` returns
metrics only; `adapters.kube` reads the cluster); the join is here, in the program
layer, as a pure function plus the small source the controller ticks.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuscaler.adapters.kube.objects import CurrentState
from gpuscaler.adapters.prometheus.source import (
    Metrics,
    PoolMetrics,
    PrometheusMetrics,
    WorkloadMetrics,
)
from gpuscaler.adapters.prometheus.transport import Transport
from gpuscaler.config import Config
from gpuscaler.core.snapshot import Observations, RawPool, RawWorkload

StateReader = Callable[[], CurrentState]
"""Reads what the cluster runs now; called once per tick."""


def join(metrics: Metrics, state: CurrentState) -> Observations:
    """The core's raw observations: each target's metrics with its cluster state; a
    problem of either system is the target's problem (Prometheus' named first)."""
    pools = tuple(_pool(p, state) for p in metrics.pools)
    workloads = tuple(_workload(w, state) for w in metrics.workloads)
    return Observations(metrics.time, pools, workloads)


def _pool(p: PoolMetrics, state: CurrentState) -> RawPool:
    if p.unmatched:
        return RawPool(p.name, None, None, state.fragments.get(p.name), None, problem=p.problem)
    return RawPool(
        name=p.name,
        utilization=p.utilization,
        stall=p.stall,
        fragments=state.fragments.get(p.name),
        time_slice_level=state.time_slice_levels.get(p.name),
        gpu_memory_gib=p.memory_total_gib or state.gpu_memory_gib.get(p.name),
        max_shares_held=state.shares_held.get(p.name, 0),
        memory_used_gib=p.memory_used_gib,
        problem=_problem(p.problem, state.problems.get(f"pool:{p.name}")),
    )


def _workload(w: WorkloadMetrics, state: CurrentState) -> RawWorkload:
    return RawWorkload(
        key=w.key,
        load=w.load,
        floor=state.floors.get(w.key),
        replicas=state.replicas.get(w.key),
        max_replicas=state.max_replicas.get(w.key),
        problem=_problem(w.problem, state.problems.get(f"workload:{w.key}")),
        serving=w.serving,
        demand=w.demand,
        demand_problem=f"prometheus: {w.demand_problem}" if w.demand_problem else None,
    )


def _problem(prometheus: str | None, cluster: str | None) -> str | None:
    if prometheus:
        return f"prometheus: {prometheus}"
    return f"kubernetes: {cluster}" if cluster else None


class PrometheusSource(PrometheusMetrics):
    """Metrics from Prometheus joined with the cluster's current state (fixed, or read
    each tick by a `StateReader`)."""

    def __init__(
        self, config: Config, state: CurrentState | StateReader, transport: Transport | None = None
    ):
        super().__init__(config, transport)
        self.state = state

    @property
    def backfilling(self) -> bool:
        return self.backfill.busy

    def observe(self, now: float) -> Observations:
        state = self.state() if callable(self.state) else self.state  # the cluster first
        return join(self.read(now), state)
