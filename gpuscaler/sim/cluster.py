"""An in-process simulated cluster: one GPU inference workload on one node pool, driven by
a request trace at 500 ms resolution.

The load model (stated wherever results are shown):

- Requests: the trace's per-bin rate, linearly interpolated to 500 ms, with Poisson
  arrivals in each 500 ms slot (seeded).
- Work: each request costs `gpu_seconds_per_request` GPU-seconds on a whole GPU.
- Fragments: with f fragments per GPU each replica holds 1/f of a GPU; time-slicing f
  tenants costs `switch_overhead` of throughput per doubling, so busy GPU time =
  work / (1 - switch_overhead * log2 f).
- Capacity: ready replicas x 1/f GPU of busy time. Demand above it is under-provisioning.
- Utilization: the workload's load signal is its busy GPU time in percent of one GPU
  (capped by capacity) plus Gaussian measurement noise; a pool GPU's utilization is that
  load over the GPUs its ready replicas occupy. 0.2 % of samples are dropped (gaps).
- Stall: 30 % x utilization^2 x log2(f)/3, scaled by the time slice level (long 0.6,
  medium 1.0, short 1.2, default 1.1): contention grows with tenants and load.
- Replicas: a new replica is ready `cold_start` after it is created; removal is at once,
  newest first. GPUs provisioned = ceil(replicas / f), ready or not.
- The reactive autoscaler (a simulated HPA) is always there: every tick it applies the
  HPA formula to the last interval's utilization, with the same target, tolerance,
  bounds, 300 s scale-down stabilization and a scale-up limit of max(2x, +4); effective
  replicas = max(floor, HPA answer).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gpuscaler.config import Config, ReplicasConfig
from gpuscaler.core.model import Decision, FloatArray, Series
from gpuscaler.core.replicas import hpa_desired
from gpuscaler.core.snapshot import Observations, RawPool, RawWorkload
from gpuscaler.sim.preemption import SimulatedPreemption
from gpuscaler.sim.trace import Trace

SAMPLE = 0.5
"""Seconds per simulated sample: dcgm-exporter's 500 ms."""
DROP_PROBABILITY = 0.002
"""Share of samples lost to missed scrapes."""
STALL_LEVEL_FACTOR = {"default": 1.1, "short": 1.2, "medium": 1.0, "long": 0.6}
HPA_SCALE_UP_PODS = 4
"""The HPA's default scale-up policy: at most double, or add 4 pods, per period."""


def demand_from_trace(
    trace: Trace, start: float, seconds: float, gpu_seconds_per_request: float, seed: int
) -> FloatArray:
    """Work arriving in each 500 ms slot, in GPUs' worth of busy time (whole GPU, no
    sharing overhead)."""
    n = int(seconds / SAMPLE)
    t = start + SAMPLE * np.arange(n)
    centers = trace.start + trace.bin_seconds * (np.arange(len(trace.counts)) + 0.5)
    rate = trace.rate
    ok = np.isfinite(rate)
    lam = np.interp(t, centers[ok], rate[ok])
    rng = np.random.default_rng(seed)
    arrivals = rng.poisson(lam * SAMPLE)
    return np.asarray(arrivals * gpu_seconds_per_request / SAMPLE, dtype=np.float64)


@dataclass
class Recorder:
    """Per-sample arrays of one run."""

    n: int
    demand_busy: FloatArray = field(init=False)
    capacity: FloatArray = field(init=False)
    load: FloatArray = field(init=False)
    pool_util: FloatArray = field(init=False)
    stall: FloatArray = field(init=False)
    gpus: FloatArray = field(init=False)
    replicas: FloatArray = field(init=False)

    def __post_init__(self) -> None:
        for name in ("demand_busy", "capacity", "load", "pool_util", "stall", "gpus", "replicas"):
            setattr(self, name, np.full(self.n, np.nan))


class SimulatedCluster:
    """Observation source and actuator for the controller, backed by the simulation."""

    name = "simulator"

    def __init__(
        self,
        config: Config,
        workload_key: str,
        pool_name: str,
        demand: FloatArray,
        start: float,
        seed: int,
        fragments: int,
    ):
        self.config = config
        self.sim = config.simulator
        self.workload_key = workload_key
        self.pool_name = pool_name
        self.replicas_cfg: ReplicasConfig = config.workload_section(
            workload_key, "replicas", ReplicasConfig
        )
        pool = next(p for p in config.node_pools if p.name == pool_name)
        self.gpu_memory_gib = pool.gpu_memory_gib
        self.demand = demand
        self.start = start
        self.rng = np.random.default_rng(seed + 1)
        self.rec = Recorder(len(demand))
        self.fragments = fragments
        self.time_slice_level = "medium" if pool.profile == "compute_bound" else "short"
        self.floor = self.replicas_cfg.min_replicas
        self.ready_at: list[float] = [start] * max(1, self.replicas_cfg.min_replicas)
        self.hpa_recs: list[tuple[float, int]] = []
        self.replica_changes: list[tuple[float, int, int]] = []
        self.fragment_changes: list[Decision] = []
        self.time_slice_changes: list[Decision] = []
        self.cursor = 0  # next sample to simulate
        burst = config.simulator.preemption_burst_after
        self.preemption = (
            SimulatedPreemption(start, config.preemption, burst_after=burst)
            if burst is not None
            else None
        )

    # ------------------------------------------------------------------ simulation

    def share(self) -> float:
        return 1.0 / self.fragments

    def efficiency(self) -> float:
        return 1.0 - self.sim.switch_overhead * math.log2(self.fragments)

    def advance_to(self, now: float) -> None:
        """Simulate the samples in [cursor time, now)."""
        if self.preemption is not None:
            self.preemption.advance(now)
        end = min(len(self.demand), round((now - self.start) / SAMPLE))
        if end <= self.cursor:
            return
        idx = np.arange(self.cursor, end)
        t = self.start + SAMPLE * idx
        ready_times = np.sort(np.asarray(self.ready_at))
        ready = np.searchsorted(ready_times, t, side="right").astype(np.float64)
        f = self.fragments
        demand_busy = self.demand[idx] / self.efficiency()
        capacity = ready / f
        served = np.minimum(demand_busy, capacity)
        noise = self.rng.normal(0.0, self.sim.noise_pct, len(idx))
        load = np.maximum(0.0, 100.0 * served + noise * np.sqrt(np.maximum(ready / f, 1.0)))
        gpus_ready = np.maximum(1.0, np.ceil(ready / f))
        util = np.clip(100.0 * served / gpus_ready + noise, 0.0, 100.0)
        stall = (
            30.0
            * (util / 100.0) ** 2
            * (math.log2(f) / 3.0)
            * STALL_LEVEL_FACTOR[self.time_slice_level]
        )
        stall = np.clip(stall + self.rng.normal(0.0, 0.5, len(idx)), 0.0, 100.0)
        dropped = self.rng.random(len(idx)) < DROP_PROBABILITY
        load[dropped] = np.nan
        util[dropped] = np.nan
        stall[dropped] = np.nan
        r = self.rec
        r.demand_busy[idx] = demand_busy
        r.capacity[idx] = capacity
        r.load[idx] = load
        r.pool_util[idx] = util
        r.stall[idx] = stall
        r.gpus[idx] = math.ceil(len(self.ready_at) / f)
        r.replicas[idx] = len(self.ready_at)
        self.cursor = end

    def ready_count(self, now: float) -> int:
        return sum(1 for t in self.ready_at if t <= now)

    def set_replicas(self, now: float, n: int) -> None:
        current = len(self.ready_at)
        if n == current:
            return
        if n > current:
            self.ready_at += [now + self.sim.cold_start] * (n - current)
        else:
            self.ready_at = sorted(self.ready_at)[:n]  # newest (latest ready) go first
        self.replica_changes.append((now, current, n))

    def hpa_step(self, now: float) -> None:
        """The reactive autoscaler: HPA formula on the last interval's utilization."""
        cfg = self.replicas_cfg
        i1 = self.cursor
        i0 = max(0, i1 - int(self.config.control.interval / SAMPLE))
        window = self.rec.load[i0:i1]
        finite = window[np.isfinite(window)]
        ready = self.ready_count(now)
        current = len(self.ready_at)
        if finite.size == 0 or ready == 0:
            desired = current  # missing metrics: hold, as the HPA does on no data
        else:
            load = float(finite.mean())
            usage_ratio = load / (self.share() * ready * cfg.target_utilization_pct)
            if abs(usage_ratio - 1) <= cfg.tolerance:
                desired = current
            else:
                desired = hpa_desired(load, self.share(), cfg.target_utilization_pct)
        ceiling = cfg.max_replicas
        desired = max(cfg.min_replicas, min(ceiling, desired))
        desired = min(desired, max(2 * current, current + HPA_SCALE_UP_PODS))
        self.hpa_recs = [(t, v) for t, v in self.hpa_recs if t > now - 300.0] + [(now, desired)]
        if desired < current:
            desired = min(current, max(v for _, v in self.hpa_recs))
        self.set_replicas(now, max(self.floor, desired))

    # ------------------------------------------------------------------ ports

    def _series(self, values: FloatArray, now: float) -> Series:
        end = self.cursor
        begin = max(0, end - int(self.config.metrics.window / SAMPLE))
        start = self.start + SAMPLE * begin
        return Series(start=start, step=SAMPLE, values=values[begin:end])

    def observe(self, now: float) -> Observations:
        pool = RawPool(
            name=self.pool_name,
            utilization=self._series(self.rec.pool_util, now),
            stall=self._series(self.rec.stall, now),
            fragments=self.fragments,
            time_slice_level=self.time_slice_level,
            gpu_memory_gib=self.gpu_memory_gib,
            max_shares_held=0,
        )
        workload = RawWorkload(
            key=self.workload_key,
            load=self._series(self.rec.load, now),
            floor=self.floor,
            replicas=len(self.ready_at),
            max_replicas=self.replicas_cfg.max_replicas,
            replica_gpu_share=self.share(),
        )
        preemption = self.preemption.observe(now) if self.preemption is not None else None
        return Observations(now, (pool,), (workload,), preemption)

    def apply(self, decisions: Sequence[Decision]) -> tuple[Decision, ...]:
        for d in decisions:
            if d.kind == "preemption":
                assert self.preemption is not None
                self.preemption.apply(d)
            elif d.kind == "replica_floor":
                self.floor = int(d.to_value)
                self.set_replicas(d.time, max(self.floor, len(self.ready_at)))
            elif d.kind == "fragments":
                self.fragments = int(d.to_value)
                self.fragment_changes.append(d)
            elif d.kind == "time_slice":
                self.time_slice_level = str(d.to_value)
                self.time_slice_changes.append(d)
        return tuple(decisions)
