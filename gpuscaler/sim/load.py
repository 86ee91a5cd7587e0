"""The simulator's load model (stated wherever results are shown), in slots of
`simulator.slot` (500 ms by default, dcgm-exporter's samples):

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

from dataclasses import dataclass, field

import numpy as np

from gpuscaler.core.model import FloatArray
from gpuscaler.sim.trace import Trace

SAMPLE = 0.5
"""Seconds per simulated sample at the default slot (dcgm-exporter's 500 ms), and the
spacing at which pods are counted inside a coarser slot."""
DROP_PROBABILITY = 0.002
"""Share of samples lost to missed scrapes."""
STALL_LEVEL_FACTOR = {"default": 1.1, "short": 1.2, "medium": 1.0, "long": 0.6}


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


def layout_capacity(ready: FloatArray, fragments: FloatArray | int, overhead: float) -> FloatArray:
    """GPUs' worth of service of `ready` replicas packed `fragments` to a GPU
    (elementwise: per run, broadcast)."""
    full = np.floor(ready / fragments)
    rest = ready - full * fragments
    partial = np.where(rest > 0, efficiency(rest, overhead), 0.0)
    return np.asarray(full * efficiency(fragments, overhead) + partial, dtype=np.float64)


@dataclass
class Draws:
    """The random streams of a seed: the utilization and stall noise and the dropped
    scrapes of `n` slots (one for every run), and the cold starts."""

    seed: int
    n: int
    noise: FloatArray = field(init=False)
    stall_noise: FloatArray = field(init=False)
    dropped: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed + 1)
        self.noise = rng.normal(0.0, 1.0, self.n)
        self.stall_noise = rng.normal(0.0, 0.5, self.n)
        self.dropped = rng.random(self.n) < DROP_PROBABILITY
