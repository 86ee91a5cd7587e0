"""Many replays in lockstep through one controller (issue 20's what-if at 100 workloads).

Each workload keeps its own simulated cluster, exactly as in `simulate`; one controller
ticks them all, so that at each tick the core forecasts every pool's and workload's
series in one batched call (the fast engine's fit, the ensemble's live paths and the
refreshed errors are numpy over rows: their per-call cost is paid once a tick, not once a
workload).

The outcomes stay independent because nothing in a tick couples targets:
- each lane's pool is its own: the combined config names it `<pool>-lane<i>` (its
  overrides kept), so two workloads on one configured pool never share a fragment or
  time-slice decision, a fit state or a decision history; decisions are renamed back to
  the configured pool before they reach the lane's cluster and its records;
- the planner decides per target (fragments and time slice per pool, the replica floor
  per workload) from that target's observation and history only; the only cross-target
  step, preemption, is off (what-if replays have no synthetic burst: lanes need
  `simulator.preemption_burst_after` null);
- the forecast's rows are independent (tests/test_lockstep.py checks the lanes' figures
  and decisions equal the one-workload runs').
The lanes' clusters advance, and their HPAs step, together (`gpuscaler.sim.lanes`: array
operations with a lane axis, the same figures as each alone): the checks above make them
able to (one range, slot and simulator config; the HPA on utilization; no burst).
What is shared: the tick itself. A tick that raises is lost for every lane at once (each
lane's `failed_ticks` counts it), where separate runs would lose it for one workload.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from gpuscaler.config import Config, NodePoolConfig, WorkloadConfig
from gpuscaler.controller import Controller, TickResult
from gpuscaler.core.decisions import Decision, FragmentsDecision, TimeSliceDecision
from gpuscaler.core.snapshot import Observations
from gpuscaler.sim.cluster import SimulatedCluster
from gpuscaler.sim.lanes import LaneClusters
from gpuscaler.sim.simulate import ForecastTrack, Prepared, RunResult, scenario_cluster
from gpuscaler.sim.ticks import control_ticks


class LockstepError(ValueError):
    """Replays that cannot share a controller (the message says why)."""


@dataclass
class Placement:
    """Where one workload's replay sits in the lockstep's combined config."""

    workload: WorkloadConfig
    pool: NodePoolConfig
    lane_pool: str
    """Its pool's name in the combined config."""


@dataclass
class Lane(Placement):
    """One workload's replay inside the lockstep."""

    cluster: SimulatedCluster
    decisions: list[Decision]
    track: ForecastTrack


def shared_part(config: Config) -> Config:
    """What every lane's config must share: all of it but its workloads and pools."""
    return config.model_copy(update={"workloads": (), "node_pools": ()})


def lockstep_key(p: Prepared) -> tuple[float, float, int, str]:
    """Replays with equal keys (and equal `shared_part`) can run in one lockstep."""
    return (p.start, p.seconds, p.seed, shared_part(p.config).model_dump_json())


def place(i: int, p: Prepared) -> Placement:
    """Lane `i`'s workload, its pool, and that pool's copy's name `<pool>-lane<i>`."""
    workload = next(w for w in p.config.workloads if w.node_pool)
    pool = next(x for x in p.config.node_pools if x.name == workload.node_pool)
    return Placement(workload, pool, f"{pool.name}-lane{i}")


def make_lane(i: int, p: Prepared) -> Lane:
    """Lane `i`: the replay's cluster, its pool copied as `<pool>-lane<i>`."""
    at = place(i, p)
    cluster = scenario_cluster(p.config, p.arrivals, p.start, p.seed)
    return Lane(at.workload, at.pool, at.lane_pool, cluster, [], ForecastTrack())


def make_lanes(preps: Sequence[Prepared]) -> tuple[list[Lane], LaneClusters]:
    """Every replay's lane (`preps` not empty), their clusters together: each lane's
    cluster joins the lanes' tables as soon as it is built, so its own records are freed
    before the next is built."""
    lanes = [make_lane(0, preps[0])]
    batch = LaneClusters(lanes[0].cluster, len(preps))
    for i, p in enumerate(preps[1:], 1):
        lanes.append(make_lane(i, p))
        batch.add(lanes[-1].cluster)
    return lanes, batch


def combined_config(preps: Sequence[Prepared], lanes: Sequence[Placement]) -> Config:
    """One config holding every lane's workload on its own copy of its pool."""
    first = preps[0]
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


class LockstepClusters:
    """Observation source and actuator over every lane's cluster."""

    name = "simulator"

    def __init__(self, lanes: Sequence[Lane], batch: LaneClusters | None = None):
        self.lanes = list(lanes)
        self.by_pool = {lane.lane_pool: lane for lane in self.lanes}
        self.by_workload = {lane.workload.key: lane for lane in self.lanes}
        self.batch = batch
        """The lanes' clusters together (their signals read at once), when they are."""
        self.names = [lane.lane_pool for lane in self.lanes]
        self.tracks = {lane.workload.key: lane.track for lane in self.lanes}

    def observe(self, now: float) -> Observations:
        if self.batch is not None:
            pools, workloads = self.batch.signals(self.names)
            return Observations(now, tuple(pools), tuple(workloads))
        pools, workloads = [], []
        for lane in self.lanes:
            pool, workload = lane.cluster.signals(lane.lane_pool)
            pools.append(pool)
            workloads.append(workload)
        return Observations(now, tuple(pools), tuple(workloads))

    def _lane_of(self, d: Decision) -> Lane:
        if isinstance(d, FragmentsDecision | TimeSliceDecision):
            return self.by_pool[d.target]
        return self.by_workload[d.target]

    def apply(self, decisions: Sequence[Decision]) -> tuple[Decision, ...]:
        """Each lane's decisions, in the plan's order, to its cluster under the
        configured pool's name (as a one-workload run names them)."""
        routed: dict[str, list[Decision]] = {}
        for d in decisions:
            lane = self._lane_of(d)
            named = replace(d, target=lane.pool.name) if d.target == lane.lane_pool else d
            routed.setdefault(lane.lane_pool, []).append(named)
        for pool, own in routed.items():
            lane = self.by_pool[pool]
            lane.decisions.extend(lane.cluster.apply(own))
        return tuple(decisions)

    def record(self, result: TickResult) -> None:
        """Each lane's forecast at this tick on its track."""
        origin, tracks = result.plan.time, self.tracks
        for w in result.snapshot.workloads:
            tracks[w.key].add_workload(origin, w)


PROGRESS_TICKS = 120
"""Ticks between two calls of a lockstep's `progress` (an hour of replay at 30 s)."""


def lockstep_runs(
    preps: Sequence[Prepared], progress: Callable[[float], None] | None = None
) -> list[RunResult]:
    """gpuscaler's run of every replay in `preps`, all through one controller: the same
    runs as `gpuscaler_run` of each alone. `progress` is told the share of ticks done every
    PROGRESS_TICKS ticks and at the end (1.0)."""
    if not preps:
        return []
    config = combined_config(preps, [place(i, p) for i, p in enumerate(preps)])
    lanes, batch = make_lanes(preps)
    clusters = LockstepClusters(lanes, batch)
    controller = Controller(config, clusters, clusters, dry_run=False, log_decisions=False)
    controller.stats.listeners.append(clusters.record)
    first = preps[0]
    ticks = control_ticks(first.start, first.seconds, config.control.interval)
    for i, t in enumerate(ticks):
        batch.advance_to(t)
        batch.hpa_step(t)
        controller.safe_tick(t)
        if progress is not None and i % PROGRESS_TICKS == PROGRESS_TICKS - 1:
            progress((i + 1) / len(ticks))
    batch.advance_to(first.start + first.seconds)
    batch.finish()
    if progress is not None:
        progress(1.0)
    failed = controller.stats.failed
    return [
        RunResult("gpuscaler", lane.cluster, lane.decisions, lane.track, failed) for lane in lanes
    ]
