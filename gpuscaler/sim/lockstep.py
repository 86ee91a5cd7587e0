"""The real controller driving the simulated cluster: one replay (`simulate`'s gpuscaler
run) or many in lockstep (what-if's lanes), each replay one run of one model
(`gpuscaler.sim.cluster.Clusters`), all ticked through one controller, so that at each
tick the core forecasts every pool's and workload's series in one batched call.

The outcomes stay independent because nothing in a tick couples targets:
- each lane's pool is its own: with more than one lane the combined config names it
  `<pool>-lane<i>` (its overrides kept), so two workloads on one configured pool never
  share a fragment or time-slice decision, a fit state or a decision history; decisions
  are renamed back to the configured pool before they reach the lane's run and records;
- the planner decides per target (fragments and time slice per pool, the replica floor
  per workload) from that target's observation and history only; the only cross-target
  step, preemption, runs only for a single replay (its synthetic burst: lanes need
  `simulator.preemption_burst_after` null).
What is shared: the tick itself. A tick that raises is lost for every lane at once (each
lane's `failed_ticks` counts it), where separate runs would lose it for one workload.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from gpuscaler.config import Config, NodePoolConfig, WorkloadConfig
from gpuscaler.controller import Controller, TickResult
from gpuscaler.core.decisions import (
    Decision,
    FragmentsDecision,
    PreemptionStep,
    TimeSliceDecision,
)
from gpuscaler.core.snapshot import Observations
from gpuscaler.sim.cluster import Clusters, scenario_run
from gpuscaler.sim.preemption import SimulatedPreemption
from gpuscaler.sim.simulate import ForecastTrack, Prepared, RunResult
from gpuscaler.sim.ticks import control_ticks

if TYPE_CHECKING:
    from gpuscaler.observability import ControllerMetrics


class LockstepError(ValueError):
    """Replays that cannot share a controller (the message says why)."""


@dataclass
class Lane:
    """Where one workload's replay sits in the combined config, and what it did."""

    workload: WorkloadConfig
    pool: NodePoolConfig
    lane_pool: str
    """Its pool's name in the combined config."""
    decisions: list[Decision]
    track: ForecastTrack


def shared_part(config: Config) -> Config:
    """What every lane's config must share: all of it but its workloads and pools."""
    return config.model_copy(update={"workloads": (), "node_pools": ()})


def lockstep_key(p: Prepared) -> tuple[float, float, int, str]:
    """Replays with equal keys (and equal `shared_part`) can run in one lockstep."""
    return (p.start, p.seconds, p.seed, shared_part(p.config).model_dump_json())


def place(i: int, p: Prepared, lanes: int) -> Lane:
    """Lane `i` of `lanes`: its workload, its pool, and that pool's name in the combined
    config (`<pool>-lane<i>` when there is more than one lane)."""
    workload = next(w for w in p.config.workloads if w.node_pool)
    pool = next(x for x in p.config.node_pools if x.name == workload.node_pool)
    name = pool.name if lanes == 1 else f"{pool.name}-lane{i}"
    return Lane(workload, pool, name, [], ForecastTrack())


def combined_config(preps: Sequence[Prepared], lanes: Sequence[Lane]) -> Config:
    """One config holding every lane's workload on its own copy of its pool."""
    first = preps[0]
    if len(preps) == 1:
        return first.config
    key = lockstep_key(first)
    if first.config.simulator.preemption_burst_after is not None:
        raise LockstepError("lockstep replays run without a synthetic preemption burst")
    for p in preps[1:]:
        if lockstep_key(p) != key:
            raise LockstepError(
                f"{p.trace}: its range, seed or config (workloads and pools aside) differs "
                f"from {first.trace}'s"
            )
    keys = [lane.workload.key for lane in lanes]
    if len(set(keys)) != len(keys):
        raise LockstepError("a workload appears twice in one lockstep")
    return first.config.model_copy(
        update={
            "node_pools": tuple(
                lane.pool.model_copy(update={"name": lane.lane_pool}) for lane in lanes
            ),
            "workloads": tuple(
                lane.workload.model_copy(update={"node_pool": lane.lane_pool}) for lane in lanes
            ),
        }
    )


class ClusterPorts:
    """Observation source and actuator over the runs of `clusters`, run i being lane i,
    with the simulated preemption pool of a single replay."""

    name = "simulator"

    def __init__(
        self,
        clusters: Clusters,
        lanes: Sequence[Lane],
        preemption: SimulatedPreemption | None = None,
    ):
        self.clusters, self.lanes, self.preemption = clusters, list(lanes), preemption
        self.by_pool = {lane.lane_pool: i for i, lane in enumerate(self.lanes)}
        self.by_workload = {lane.workload.key: i for i, lane in enumerate(self.lanes)}

    def advance_to(self, now: float) -> None:
        """Every run's slots and the preemption pool up to `now`."""
        if self.preemption is not None:
            self.preemption.advance(now)
        self.clusters.advance_to(now)

    def observe(self, now: float) -> Observations:
        pools, workloads = [], []
        for i, lane in enumerate(self.lanes):
            pool, workload = self.clusters.signals(i, lane.lane_pool, lane.workload.key)
            pools.append(pool)
            workloads.append(workload)
        preemption = self.preemption.observe(now) if self.preemption is not None else None
        return Observations(now, tuple(pools), tuple(workloads), preemption)

    def _lane_of(self, d: Decision) -> int:
        if isinstance(d, FragmentsDecision | TimeSliceDecision):
            return self.by_pool[d.target]
        return self.by_workload[d.target]

    def apply(self, decisions: Sequence[Decision]) -> tuple[Decision, ...]:
        """Each lane's decisions, in the plan's order, to its run under the configured
        pool's name (as a one-workload run names them); preemption steps to the pool."""
        routed: dict[int, list[Decision]] = {}
        for d in decisions:
            if isinstance(d, PreemptionStep):
                assert self.preemption is not None
                self.preemption.apply(d)
                self.lanes[0].decisions.append(d)
                continue
            i = self._lane_of(d)
            lane = self.lanes[i]
            named = replace(d, target=lane.pool.name) if d.target == lane.lane_pool else d
            routed.setdefault(i, []).append(named)
            lane.decisions.append(named)
        for i, own in routed.items():
            self.clusters.apply(i, own)
        return tuple(decisions)

    def record(self, result: TickResult) -> None:
        """Each lane's forecast at this tick on its track."""
        origin = result.plan.time
        for w in result.snapshot.workloads:
            self.lanes[self.by_workload[w.key]].track.add_workload(origin, w)


def lane_clusters(preps: Sequence[Prepared]) -> Clusters:
    """The simulated cluster of every replay of `preps` (one range and seed), run i on
    replay i's arrivals, its pool observed by the controller."""
    first = preps[0]
    specs = [scenario_run(p.config, i, recorded=True, observed=True) for i, p in enumerate(preps)]
    arrivals = np.stack([p.arrivals for p in preps])
    return Clusters(first.config, arrivals, first.start, first.seed, specs)


PROGRESS_TICKS = 120
"""Ticks between two calls of a lockstep's `progress` (an hour of replay at 30 s)."""


def lockstep_runs(
    preps: Sequence[Prepared],
    progress: Callable[[float], None] | None = None,
    metrics: Sequence[ControllerMetrics] = (),
) -> list[RunResult]:
    """gpuscaler's run of every replay in `preps`, all through one controller (a replay
    runs alone with its synthetic preemption burst, when its config has one). It runs
    from the start: until forecast.min_history its floor sizes for the observed demand
    alone (no forecast yet), then the forecast may add. `progress` is told the share of
    ticks done every PROGRESS_TICKS ticks and at the end (1.0)."""
    if not preps:
        return []
    lanes = [place(i, p, len(preps)) for i, p in enumerate(preps)]
    config = combined_config(preps, lanes)
    first = preps[0]
    burst = config.simulator.preemption_burst_after
    preemption = (
        SimulatedPreemption(first.start, config.preemption, burst_after=burst)
        if burst is not None
        else None
    )
    clusters = lane_clusters(preps)
    ports = ClusterPorts(clusters, lanes, preemption)
    controller = Controller(config, ports, ports, dry_run=False, log_decisions=False)
    controller.stats.listeners.append(ports.record)
    for m in metrics:
        m.attach(controller)
    ticks = control_ticks(first.start, first.seconds, config.control.interval)
    for i, t in enumerate(ticks):
        ports.advance_to(t)
        clusters.hpa_step(t)
        controller.safe_tick(t)
        if progress is not None and i % PROGRESS_TICKS == PROGRESS_TICKS - 1:
            progress((i + 1) / len(ticks))
    ports.advance_to(first.start + first.seconds)
    if progress is not None:
        progress(1.0)
    failed = controller.stats.failed
    views = clusters.views()
    if preemption is not None:
        views[0].preemption = preemption
    return [
        RunResult("gpuscaler", view, lane.decisions, lane.track, failed)
        for view, lane in zip(views, lanes, strict=True)
    ]
