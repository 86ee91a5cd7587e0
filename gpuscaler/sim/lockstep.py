"""The real controller driving the simulated cluster: one replay or many in lockstep
(what-if's lanes, one model), so that a tick forecasts every series in one batch. Lanes
stay independent: each has its own copy of its pool (`<pool>-lane<i>`, decisions renamed
back), and preemption, the one cross-target step, runs for a single replay only. A tick
that raises is lost for every lane."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from gpuscaler.config import Config, NodePoolConfig, WorkloadConfig
from gpuscaler.controller import Controller, TickResult
from gpuscaler.core.decisions import Decision, FragmentsDecision, PreemptionStep, TimeSliceDecision
from gpuscaler.core.snapshot import Observations
from gpuscaler.sim.cluster import Clusters, scenario_run
from gpuscaler.sim.preemption import SimulatedPreemption
from gpuscaler.sim.records import ForecastTrack, RunResult, finished
from gpuscaler.sim.replay import ModelError, Prepared, one_model, scenario

if TYPE_CHECKING:
    from gpuscaler.observability import ControllerMetrics

PROGRESS_TICKS = 120
"""Ticks between two calls of a lockstep's `progress` (an hour of replay at 30 s)."""


@dataclass
class Lane:
    """Where one workload's replay sits in the combined config, and what it did."""

    workload: WorkloadConfig
    pool: NodePoolConfig
    lane_pool: str
    """Its pool's name in the combined config."""
    decisions: list[Decision] = field(default_factory=list)
    track: ForecastTrack = field(default_factory=ForecastTrack)


class ClusterPorts:
    """Observation source and actuator over the runs of `clusters`, run i being lane i,
    with the simulated preemption pool of a single replay."""

    name = "simulator"

    def __init__(
        self, clusters: Clusters, lanes: Sequence[Lane], preemption: SimulatedPreemption | None
    ):
        self.clusters, self.lanes, self.preemption = clusters, list(lanes), preemption
        self.by_pool = {lane.lane_pool: i for i, lane in enumerate(self.lanes)}
        self.by_workload = {lane.workload.key: i for i, lane in enumerate(self.lanes)}

    def advance_to(self, now: float) -> None:
        if self.preemption is not None:
            self.preemption.advance(now)
        self.clusters.advance_to(now)

    def observe(self, now: float) -> Observations:
        found = [
            self.clusters.signals(i, lane.lane_pool, lane.workload.key)
            for i, lane in enumerate(self.lanes)
        ]
        preemption = self.preemption.observe(now) if self.preemption is not None else None
        return Observations(now, tuple(p for p, _ in found), tuple(w for _, w in found), preemption)

    def apply(self, decisions: Sequence[Decision]) -> tuple[Decision, ...]:
        """Each lane's decisions, in the plan's order, to its run under the configured
        pool's name; preemption steps to the preemption pool."""
        routed: dict[int, list[Decision]] = {}
        for d in decisions:
            if isinstance(d, PreemptionStep):
                assert self.preemption is not None
                self.preemption.apply(d)
                self.lanes[0].decisions.append(d)
                continue
            by_pool = isinstance(d, FragmentsDecision | TimeSliceDecision)
            i = self.by_pool[d.target] if by_pool else self.by_workload[d.target]
            lane = self.lanes[i]
            named = replace(d, target=lane.pool.name) if d.target == lane.lane_pool else d
            routed.setdefault(i, []).append(named)
            lane.decisions.append(named)
        for i, own in routed.items():
            self.clusters.apply(i, own)
        return tuple(decisions)

    def record(self, result: TickResult) -> None:
        """Each lane's forecast at this tick on its track."""
        for w in result.snapshot.workloads:
            self.lanes[self.by_workload[w.key]].track.add(result.plan.time, w)


def lane_ports(preps: Sequence[Prepared], recorded: bool = True) -> tuple[Config, ClusterPorts]:
    """The combined config and the ports over the simulated cluster of every replay of
    `preps`, run i on replay i's arrivals, its pool observed by the controller; a single
    replay with its synthetic preemption burst, when its config has one."""
    lanes = []
    for i, p in enumerate(preps):  # each pool named `<pool>-lane<i>` when there are more
        workload, pool = scenario(p.config)
        lanes.append(Lane(workload, pool, pool.name if len(preps) == 1 else f"{pool.name}-lane{i}"))
    config, first = preps[0].config, preps[0]
    if len(preps) > 1:  # one config: every lane's workload on its own copy of its pool
        if config.simulator.preemption_burst_after is not None:
            raise ModelError("lockstep replays run without a synthetic preemption burst")
        one_model(preps)
        keys = [lane.workload.key for lane in lanes]
        if len(set(keys)) != len(keys):
            raise ModelError("a workload appears twice in one lockstep")
        pools = tuple(lane.pool.model_copy(update={"name": lane.lane_pool}) for lane in lanes)
        workloads = tuple(
            lane.workload.model_copy(update={"node_pool": lane.lane_pool}) for lane in lanes
        )
        config = config.model_copy(update={"node_pools": pools, "workloads": workloads})
    burst = config.simulator.preemption_burst_after
    preemption = (
        None
        if burst is None
        else SimulatedPreemption(first.start, config.preemption, burst_after=burst)
    )
    specs = [
        scenario_run(p.config, i, recorded=recorded, observed=True) for i, p in enumerate(preps)
    ]
    arrivals = np.stack([p.arrivals for p in preps])
    clusters = Clusters(first.config, arrivals, first.start, first.seed, specs, first.scored_from)
    return config, ClusterPorts(clusters, lanes, preemption)


def lockstep_runs(
    preps: Sequence[Prepared],
    progress: Callable[[float], None] | None = None,
    metrics: Sequence[ControllerMetrics] = (),
    plot: bool = True,
) -> list[RunResult]:
    """gpuscaler's run of every replay in `preps` through one controller, from the start
    (its floor on the observed demand alone until forecast.min_history); `progress` is
    told the share of ticks done every PROGRESS_TICKS ticks and at the end."""
    if not preps:
        return []
    config, ports = lane_ports(preps, plot)
    clusters, first = ports.clusters, preps[0]
    controller = Controller(config, ports, ports, dry_run=False, log_decisions=False)
    controller.stats.listeners.append(ports.record)
    for m in metrics:
        m.attach(controller)
    ticks = first.ticks()
    for i, t in enumerate(ticks):
        ports.advance_to(t)
        clusters.hpa_step(t)
        controller.safe_tick(t)
        if progress is not None and i % PROGRESS_TICKS == PROGRESS_TICKS - 1:
            progress((i + 1) / len(ticks))
    ports.advance_to(first.start + first.seconds)
    if progress is not None:
        progress(1.0)
    views = clusters.views()
    views[0].preemption = ports.preemption
    failed = controller.stats.failed
    return [
        finished(p, "gpuscaler", view, lane.decisions, lane.track, failed, plot)
        for p, view, lane in zip(preps, views, ports.lanes, strict=True)
    ]
