"""An in-process simulated cluster: one GPU inference workload on one node pool, driven by
a request trace in slots of `simulator.slot` (500 ms by default, dcgm-exporter's samples).

The load model (stated wherever results are shown):

- Requests: the trace's per-bin rate, linearly interpolated to the slot, with Poisson
  arrivals in each slot (seeded).
- Work: each request costs `gpu_seconds_per_request` GPU-seconds on a whole GPU.
- Queue: work that capacity cannot serve in a slot waits, FIFO, for the next slots (a
  fluid queue, `gpuscaler.sim.queue`); nothing is dropped. A request's wait is the time
  until cumulative service reaches the cumulative work up to its slot.
- Time-slicing: replicas are packed f to a GPU (f fragments). A replica alone on a GPU
  can use all of it; k tenants sharing one lose `switch_overhead` of throughput per
  doubling, so a GPU with k tenants serves 1 - switch_overhead x log2 k GPU-seconds a
  second. GPUs held = ceil(replicas holding a pod / f).
- Lead times: a scaler's decision reaches the pods `sync_delay` later; a new pod holds
  its GPU from then and serves after a cold start drawn from [cold_start,
  cold_start_max]; a leaving ready pod keeps its GPU and serves until the queue present
  at its removal is drained (at most `drain_max`). A fragment change restarts the device
  plugin: capacity x `fragment_disruption_capacity` for `fragment_disruption`. Pods are
  counted every 500 ms whatever the slot: a coarser slot's capacity and GPUs held are the
  means of its 500 ms counts (GPU-hours stay a time integral at 500 ms; only the queue
  and the signals are coarser).
- Signals: the workload's utilization (what the HPA reads) is busy GPU time served, in
  percent of one GPU, plus Gaussian noise; its demand signal (what a request-rate query
  gives) is the arriving work in percent of one GPU. A pool's utilization is its demand
  per GPU held (what tenants would use unthrottled). 0.2 % of samples are dropped.
- Stall: 30 % x utilization^2 x log2(f)/3, scaled by the time slice level (long 0.6,
  medium 1.0, short 1.2, default 1.1): contention grows with tenants and load.
- The reactive autoscaler (`gpuscaler.sim.scalers`) is always there; effective replicas
  = max(floor, its answer).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpuscaler.config import Config, ReplicasConfig
from gpuscaler.core.decisions import (
    Decision,
    FragmentsDecision,
    PreemptionStep,
    ReplicaFloorDecision,
    TimeSliceDecision,
)
from gpuscaler.core.model import FloatArray, Series
from gpuscaler.core.snapshot import Observations, RawPool, RawWorkload
from gpuscaler.sim.pods import Pods
from gpuscaler.sim.preemption import SimulatedPreemption
from gpuscaler.sim.queue import lindley
from gpuscaler.sim.scalers import Scaler, ScalerKind
from gpuscaler.sim.trace import Trace

SAMPLE = 0.5
"""Seconds per simulated sample at the default slot (dcgm-exporter's 500 ms), and the
spacing at which pods are counted inside a coarser slot."""
DROP_PROBABILITY = 0.002
"""Share of samples lost to missed scrapes."""
STALL_LEVEL_FACTOR = {"default": 1.1, "short": 1.2, "medium": 1.0, "long": 0.6}
INF = math.inf


def arrivals_from_trace(
    trace: Trace, start: float, seconds: float, seed: int, slot: float = SAMPLE
) -> FloatArray:
    """Requests arriving in each slot: Poisson at the trace's interpolated rate."""
    n = int(seconds / slot)
    t = start + slot * np.arange(n)
    centers = trace.start + trace.bin_seconds * (np.arange(len(trace.counts)) + 0.5)
    rate = trace.rate
    ok = np.isfinite(rate)
    lam = np.interp(t, centers[ok], rate[ok])
    rng = np.random.default_rng(seed)
    return np.asarray(rng.poisson(lam * slot), dtype=np.float64)


def demand_from_trace(
    trace: Trace, start: float, seconds: float, gpu_seconds_per_request: float, seed: int
) -> FloatArray:
    """Work arriving in each 500 ms slot, in GPUs' worth of busy time (whole GPU, no
    sharing overhead)."""
    counts = arrivals_from_trace(trace, start, seconds, seed)
    return np.asarray(counts * gpu_seconds_per_request / SAMPLE, dtype=np.float64)


def efficiency(tenants: FloatArray | float, overhead: float) -> FloatArray:
    """GPU-seconds a GPU serves per second with `tenants` time-slicing it."""
    k = np.maximum(np.asarray(tenants, dtype=np.float64), 1.0)
    return np.asarray(1.0 - overhead * np.log2(k), dtype=np.float64)


def layout_capacity(ready: FloatArray, fragments: int, overhead: float) -> FloatArray:
    """GPUs' worth of service of `ready` replicas packed `fragments` to a GPU."""
    full = np.floor(ready / fragments)
    rest = ready - full * fragments
    partial = np.where(rest > 0, efficiency(rest, overhead), 0.0)
    return np.asarray(full * efficiency(fragments, overhead) + partial, dtype=np.float64)


RECORDED = (
    "requests",
    "demand_busy",
    "demand_pct",
    "capacity",
    "served",
    "queue",
    "load",
    "pool_util",
    "stall",
    "gpus",
    "replicas",
)


@dataclass
class Recorder:
    """Per-sample arrays of one run."""

    n: int
    requests: FloatArray = field(init=False)
    demand_busy: FloatArray = field(init=False)
    """Work arriving, in GPUs busy at the current sharing (overhead included)."""
    demand_pct: FloatArray = field(init=False)
    capacity: FloatArray = field(init=False)
    served: FloatArray = field(init=False)
    """GPU-seconds of work served in the slot."""
    queue: FloatArray = field(init=False)
    """GPU-seconds of work waiting at the end of the slot."""
    load: FloatArray = field(init=False)
    pool_util: FloatArray = field(init=False)
    stall: FloatArray = field(init=False)
    gpus: FloatArray = field(init=False)
    replicas: FloatArray = field(init=False)

    def __post_init__(self) -> None:
        for name in RECORDED:
            setattr(self, name, np.full(self.n, np.nan))


def _unwatched() -> None:
    """A cluster's `changed`, called when its pods, floor, fragments or time slice change
    (`set_replicas`, `apply`): a lone cluster's does nothing; a lockstep keeps its lanes'
    state as arrays (`gpuscaler.sim.lane_state`) and reads a changed lane's again."""


class SimulatedCluster:
    """Observation source and actuator for the controller, backed by the simulation."""

    name = "simulator"

    def __init__(
        self,
        config: Config,
        workload_key: str,
        pool_name: str,
        arrivals: FloatArray,
        start: float,
        seed: int,
        fragments: int,
        scaler: tuple[ScalerKind, float] | None = None,
        controlled: bool = True,
        predicted: dict[int, float] | None = None,
    ):
        self.config = config
        self.sim = config.simulator
        self.slot = self.sim.slot
        self.workload_key, self.pool_name = workload_key, pool_name
        self.replicas_cfg: ReplicasConfig = config.workload_section(
            workload_key, "replicas", ReplicasConfig
        )
        pool = next(p for p in config.node_pools if p.name == pool_name)
        self.gpu_memory_gib = pool.gpu_memory_gib
        self.arrivals = arrivals
        self.work = arrivals * self.sim.gpu_seconds_per_request  # GPU-seconds per slot
        self.start = start
        self._draw(seed, len(arrivals))
        self.observed = controlled
        """Whether a controller reads the pool's signals (baselines skip computing them)."""
        self.rec = Recorder(len(arrivals))
        self.fragments = fragments
        self.time_slice_level = "medium" if pool.profile == "compute_bound" else "short"
        self.floor = self.replicas_cfg.min_replicas
        self.pods = Pods.running(max(1, self.replicas_cfg.min_replicas), start)
        kind, target = scaler or ("hpa_util", self.replicas_cfg.target_utilization_pct)
        self.scaler = Scaler(
            kind, target, self.replicas_cfg, config.control.interval, config.forecast.horizon
        )
        self.scaler.predicted = predicted
        self.replica_changes: list[tuple[float, int, int]] = []
        self.fragment_changes: list[Decision] = []
        self.time_slice_changes: list[Decision] = []
        self.disrupted_until = -INF
        self.q = 0.0  # GPU-seconds queued at the cursor
        self.held_last = 0.0  # replicas holding a pod at the last slot's start
        self.steady_key: tuple[float, int] | None = None
        self.efficiencies: dict[float, float] = {}
        self.steady: tuple[FloatArray, FloatArray, FloatArray] = (np.zeros(1),) * 3
        self.cursor = 0  # next sample to simulate
        self.window_slots = int(config.metrics.window / self.slot)
        """Slots of the signals the controller reads (`signals`)."""
        self.signals_from = 0
        """The slot the pool's signal records start at (0; a lockstep keeps only their
        last window: `gpuscaler.sim.lanes`)."""
        self.changed: Callable[[], object] = _unwatched  # see `_unwatched`
        burst = config.simulator.preemption_burst_after
        self.preemption = (
            SimulatedPreemption(start, config.preemption, burst_after=burst)
            if burst is not None and controlled
            else None
        )

    def _draw(self, seed: int, n: int) -> None:
        """The run's random streams from its seed: the utilization and stall noise and the
        dropped scrapes of `n` slots, and the cold starts' generator."""
        rng = np.random.default_rng(seed + 1)
        self.noise = rng.normal(0.0, self.sim.noise_pct, n)
        self.stall_noise = rng.normal(0.0, 0.5, n)
        self.dropped = rng.random(n) < DROP_PROBABILITY
        self.cold_rng = np.random.default_rng(seed + 2)

    # ------------------------------------------------------------------ simulation

    def share(self) -> float:
        return 1.0 / self.fragments

    def recent(self, values: FloatArray, seconds: float) -> FloatArray:
        """The last `seconds` of a recorded array, up to the cursor."""
        return values[max(0, self.cursor - round(seconds / self.slot)) : self.cursor]

    def spec_count(self) -> int:
        """Replicas the workload asks for (pods not leaving)."""
        return self.pods.spec_count()

    def ready_count(self, now: float) -> int:
        """Replicas serving at `now`: the counts kept while no pod changes, when they
        hold at `now` (a pod's ready time is never after its leaving, so the ready count
        at `now` is the count of pods ready by then less those gone by then)."""
        pods, key = self.pods, self.steady_key
        if key is not None and key[0] == pods.steady_from <= now < pods.steady_until:
            return int(self.steady[0][0])
        return pods.ready_count(now)

    def _pods_at(self, begin: int, end: int) -> tuple[FloatArray, FloatArray, FloatArray]:
        """(ready replicas, service capacity in GPUs' worth, GPUs held) of the slots
        `begin` to `end`: `pods_over`, each of one slot repeated over all."""
        ready, capacity, gpus = self.pods_over(begin, end)
        if len(ready) == end - begin:
            return ready, capacity, gpus
        n = end - begin
        return np.repeat(ready, n), np.repeat(capacity, n), np.repeat(gpus, n)

    def pods_over(self, begin: int, end: int) -> tuple[FloatArray, FloatArray, FloatArray]:
        """(ready replicas, service capacity in GPUs' worth, GPUs held) of the slots
        `begin` to `end`: counted at each slot's start, and every 500 ms after it inside a
        coarser slot (their means); one slot's (the first's) when no pod changes over them
        and no fragment change disrupts them (it holds for all). Whether no pod changes is
        asked first, of the first and last sample alone (the floats the grid of samples
        holds)."""
        slot, sub = self.slot, max(1, math.ceil(self.slot / SAMPLE - 1e-9))
        first = self.start + slot * begin
        last = self.start + slot * (end - 1)
        if sub > 1:
            last = last + (slot / sub) * (sub - 1)
        pods = self.pods
        if not pods.steady_from <= first < pods.steady_until:
            # Within the steady span asked last, no pod left since: nothing to forget.
            pods.forget_gone(first)
        if pods.steady(first, last) and not first < self.disrupted_until:
            return self._steady_counts(first)
        t = np.asarray(self.start + slot * np.arange(begin, end), dtype=np.float64)
        if sub > 1:
            t = (t[:, None] + (slot / sub) * np.arange(sub)).ravel()
        ready, held = self.pods.counts(t)
        f = self.fragments
        capacity = layout_capacity(ready, f, self.sim.switch_overhead)
        disrupted = t < self.disrupted_until
        capacity = np.where(disrupted, capacity * self.sim.fragment_disruption_capacity, capacity)
        gpus = np.ceil(held / f)
        self.held_last = float(held[-sub])
        if sub == 1:
            return ready, capacity, gpus
        # their means, as `ndarray.mean` takes them (the sum, then over the count) without
        # its wrapper's cost (a third of this call's)
        ready, capacity, gpus = (
            a.reshape(-1, sub).sum(axis=1) / sub for a in (ready, capacity, gpus)
        )
        return ready, capacity, gpus

    def _steady_counts(self, first: float) -> tuple[FloatArray, FloatArray, FloatArray]:
        """`pods_over` of slots from `first` when no pod changes over them and no
        fragment change disrupts them: the counts at `first` (one slot's, kept while
        they hold)."""
        key = (self.pods.steady_from, self.fragments)
        if self.steady_key != key:  # the counts hold from steady_from: reuse them
            ready, held = self.pods.counts(np.array([first], dtype=np.float64))
            capacity = layout_capacity(ready, self.fragments, self.sim.switch_overhead)
            self.steady_key, self.steady = key, (ready, capacity, np.ceil(held / self.fragments))
            self.held_last = float(held[0])
        return self.steady

    def advance_to(self, now: float) -> None:
        """Simulate the slots in [cursor time, now)."""
        if self.preemption is not None:
            self.preemption.advance(now)
        slot = self.slot
        end = min(len(self.arrivals), round((now - self.start) / slot))
        if end <= self.cursor:
            return
        idx = slice(self.cursor, end)  # a view: the same values as an index array, no copy
        ready, capacity, gpus = self._pods_at(self.cursor, end)
        f = self.fragments
        work = self.work[idx]
        queue, served = lindley(self.q, work, capacity * slot)
        self.q = float(queue[-1])
        demand_pct = 100.0 * work / slot
        noise = self.noise[idx]
        load = np.maximum(0.0, 100.0 * served / slot + noise * np.sqrt(np.maximum(ready / f, 1)))
        dropped = self.dropped[idx]
        load[dropped] = np.nan  # `load` is new: the recorded noise is untouched
        eff = self._efficiency(min(f, max(1.0, self.held_last)))
        r = self.rec
        if self.observed:
            pool_util = np.clip(demand_pct / eff / np.maximum(gpus, 1.0) + noise, 0.0, None)
            busy = np.clip(100.0 * served / slot / np.maximum(gpus, 1.0), 0.0, 100.0)
            stall = 30.0 * (busy / 100.0) ** 2 * (math.log2(f) / 3.0)
            stall *= STALL_LEVEL_FACTOR[self.time_slice_level]
            stall = np.clip(stall + self.stall_noise[idx], 0.0, 100.0)
            pool_util[dropped] = np.nan
            stall[dropped] = np.nan
            r.pool_util[idx] = pool_util
            r.stall[idx] = stall
        r.requests[idx] = self.arrivals[idx]
        r.demand_busy[idx] = work / slot / eff
        r.demand_pct[idx] = demand_pct
        r.capacity[idx] = capacity
        r.served[idx] = served
        r.queue[idx] = queue
        r.load[idx] = load
        r.gpus[idx] = gpus
        r.replicas[idx] = self.spec_count()
        self.cursor = end

    def _efficiency(self, tenants: float) -> float:
        """`efficiency` of `tenants` at the pool's overhead, computed once per count."""
        eff = self.efficiencies.get(tenants)
        if eff is None:
            eff = self.efficiencies[tenants] = float(efficiency(tenants, self.sim.switch_overhead))
        return eff

    def _drain_seconds(self) -> float:
        if self.cursor == 0:
            return 0.0
        cap = float(self.rec.capacity[self.cursor - 1])
        if cap <= 0:
            return self.sim.drain_max
        return min(self.sim.drain_max, self.q / cap)

    def set_replicas(self, now: float, n: int) -> None:
        current = self.spec_count()
        if n == current:
            return
        at = now + self.sim.sync_delay
        if n > current:
            lo, hi = self.sim.cold_start, self.sim.cold_start_max
            self.pods.add(at, self.cold_rng.uniform(lo, hi, n - current))
        else:
            # Newest (latest ready) go first; one not serving yet just disappears.
            self.pods.remove_newest(n, at, self._drain_seconds())
        self.replica_changes.append((now, current, n))
        self.changed()

    def hpa_step(self, now: float) -> None:
        """The reactive autoscaler's step; effective replicas = max(floor, its answer)."""
        self.set_replicas(now, max(self.floor, self.scaler.step(self, now)))

    # ------------------------------------------------------------------ ports

    def observe(self, now: float) -> Observations:
        pool, workload = self.signals()
        preemption = self.preemption.observe(now) if self.preemption is not None else None
        return Observations(now, (pool,), (workload,), preemption)

    def signals(self, pool_name: str | None = None) -> tuple[RawPool, RawWorkload]:
        """The pool's and the workload's signals up to the cursor (the pool named
        `pool_name`, by default its own): the last `metrics.window` of each."""
        end = self.cursor
        begin = max(0, end - self.window_slots)
        start, step, rec = self.start + self.slot * begin, self.slot, self.rec
        held = slice(begin - self.signals_from, end - self.signals_from)
        pool = RawPool(
            name=pool_name or self.pool_name,
            utilization=Series(start=start, step=step, values=rec.pool_util[held]),
            stall=Series(start=start, step=step, values=rec.stall[held]),
            fragments=self.fragments,
            time_slice_level=self.time_slice_level,
            gpu_memory_gib=self.gpu_memory_gib,
            max_shares_held=0,
            gpus_held=int(self.rec.gpus[self.cursor - 1]) if self.cursor else None,
        )
        workload = RawWorkload(
            key=self.workload_key,
            load=Series(start=start, step=step, values=rec.demand_pct[begin:end]),
            floor=self.floor,
            replicas=self.spec_count(),
            max_replicas=self.replicas_cfg.max_replicas,
            replica_gpu_share=self.share(),
        )
        return pool, workload

    def apply(self, decisions: Sequence[Decision]) -> tuple[Decision, ...]:
        for d in decisions:
            match d:
                case PreemptionStep():
                    assert self.preemption is not None
                    self.preemption.apply(d)
                case ReplicaFloorDecision():
                    self.floor = d.to_value
                    self.set_replicas(d.time, max(self.floor, self.spec_count()))
                case FragmentsDecision():
                    self.fragments = d.to_value
                    self.disrupted_until = d.time + self.sim.fragment_disruption
                    self.fragment_changes.append(d)
                case TimeSliceDecision():
                    self.time_slice_changes.append(d)
                    self.time_slice_level = d.to_value
        if decisions:
            self.changed()
        return tuple(decisions)
