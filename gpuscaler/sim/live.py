"""The simulated cluster on the wall clock, for `once` and `run` until the real adapters
exist: wall time maps onto the bundled trace, one metrics window in (the window before is
warmed up with the reactive autoscaler alone)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpuscaler.config import Config
from gpuscaler.core.decisions import Decision
from gpuscaler.core.model import Series
from gpuscaler.core.snapshot import Observations
from gpuscaler.sim.cluster import Clusters, scenario_run
from gpuscaler.sim.load import arrivals_from_trace
from gpuscaler.sim.lockstep import ClusterPorts, Lane
from gpuscaler.sim.preemption import SimulatedPreemption
from gpuscaler.sim.simulate import ForecastTrack, scenario_config
from gpuscaler.sim.trace import Trace, load_trace


class LiveSimulation:
    name = "simulator"

    def __init__(
        self, config: Config, wall_start: float, trace: Trace | None = None, seed: int = 1
    ):
        self.config = scenario_config(config)
        trace = trace or load_trace()
        window = self.config.metrics.window
        self.offset = trace.start + window - wall_start  # simulated time = wall time + offset
        slot = self.config.simulator.slot
        arrivals = arrivals_from_trace(trace, trace.start, trace.duration, seed, slot)
        cfg = self.config
        self.cluster = Clusters(
            cfg, arrivals, trace.start, seed, [scenario_run(cfg, observed=True)]
        )
        workload = next(w for w in cfg.workloads if w.node_pool)
        pool = next(p for p in cfg.node_pools if p.name == workload.node_pool)
        burst = cfg.simulator.preemption_burst_after
        preemption = (
            SimulatedPreemption(trace.start, cfg.preemption, burst_after=burst)
            if burst is not None
            else None
        )
        lane = Lane(workload, pool, pool.name, [], ForecastTrack())
        self.ports = ClusterPorts(self.cluster, [lane], preemption)
        self._next_hpa = trace.start + self.config.control.interval
        self._advance(trace.start + window)

    def _advance(self, sim_now: float) -> None:
        while self._next_hpa <= sim_now:
            self.ports.advance_to(self._next_hpa)
            self.cluster.hpa_step(self._next_hpa)
            self._next_hpa += self.config.control.interval
        self.ports.advance_to(sim_now)

    def _to_wall(self, s: Series | None) -> Series | None:
        return None if s is None else replace(s, start=s.start - self.offset)

    def observe(self, now: float) -> Observations:
        sim_now = now + self.offset
        self._advance(sim_now)
        obs = self.ports.observe(sim_now)
        return Observations(
            time=now,
            pools=tuple(
                replace(p, utilization=self._to_wall(p.utilization), stall=self._to_wall(p.stall))
                for p in obs.pools
            ),
            workloads=tuple(replace(w, load=self._to_wall(w.load)) for w in obs.workloads),
        )

    def apply(self, decisions: Sequence[Decision]) -> tuple[Decision, ...]:
        self.ports.apply([replace(d, time=d.time + self.offset) for d in decisions])
        return tuple(decisions)
