"""The simulated cluster on the wall clock, for `once` and `run` without a Prometheus:
wall time maps onto the bundled trace, one metrics window in (the window before is
warmed up with the reactive autoscaler alone)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpuscaler.config import Config
from gpuscaler.core.decisions import Decision
from gpuscaler.core.model import Series
from gpuscaler.core.snapshot import Observations
from gpuscaler.sim.lockstep import lane_ports
from gpuscaler.sim.replay import prepare
from gpuscaler.sim.trace import Trace, load_trace


class LiveSimulation:
    name = "simulator"

    def __init__(
        self, config: Config, wall_start: float, trace: Trace | None = None, seed: int = 1
    ):
        trace = trace or load_trace()
        p = prepare(trace, None, seed, config)
        self.config, self.interval = p.config, p.config.control.interval
        window = self.config.metrics.window
        self.offset = trace.start + window - wall_start  # simulated time = wall time + offset
        self.ports = lane_ports([p], recorded=False)[1]  # nothing reads its record
        self._next_hpa = trace.start + self.interval
        self._advance(trace.start + window)

    def _advance(self, sim_now: float) -> None:
        while self._next_hpa <= sim_now:
            self.ports.advance_to(self._next_hpa)
            self.ports.clusters.hpa_step(self._next_hpa)
            self._next_hpa += self.interval
        self.ports.advance_to(sim_now)

    def _to_wall(self, s: Series | None) -> Series | None:
        return None if s is None else replace(s, start=s.start - self.offset)

    def observe(self, now: float) -> Observations:
        self._advance(now + self.offset)
        obs = self.ports.observe(now + self.offset)
        wall = self._to_wall
        pools = tuple(
            replace(p, utilization=wall(p.utilization), stall=wall(p.stall)) for p in obs.pools
        )
        workloads = tuple(replace(w, load=wall(w.load)) for w in obs.workloads)
        return Observations(now, pools, workloads)

    def apply(self, decisions: Sequence[Decision]) -> tuple[Decision, ...]:
        self.ports.apply([replace(d, time=d.time + self.offset) for d in decisions])
        return tuple(decisions)
