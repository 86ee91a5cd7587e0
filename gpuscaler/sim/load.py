"""The simulator's load model, in slots of `simulator.slot` (docs/evaluation.md states it
in full): Poisson arrivals at the trace's interpolated rate, each request
`gpu_seconds_per_request` of work on a whole GPU, a fluid FIFO queue that drops nothing,
k tenants time-slicing a GPU losing `switch_overhead` of throughput per doubling, noisy
signals with 0.2 % of samples dropped, and a stall of 30 % x utilization^2 x log2(f)/3
scaled by the time slice level."""

from __future__ import annotations

import numpy as np

from gpuscaler.core.model import FloatArray
from gpuscaler.sim.trace import Trace

SAMPLE = 0.5
"""The default slot (dcgm-exporter's 500 ms), at which pods are counted in any slot."""
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


def draws(seed: int, n: int) -> tuple[FloatArray, FloatArray, np.ndarray]:
    """The random streams of a seed over `n` slots, one for every run: the utilization
    and stall noise and the dropped scrapes."""
    rng = np.random.default_rng(seed + 1)
    noise, stall = rng.normal(0.0, 1.0, n), rng.normal(0.0, 0.5, n)
    return noise, stall, rng.random(n) < DROP_PROBABILITY


def lindley(
    q0: float | FloatArray, work: FloatArray, service: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Queue left at the end of each slot and work served in it, of queues (rows) holding
    `q0` before the first slot, with `work` arriving and `service` capacity a slot:
    Q_t = max(0, Q_t-1 + A_t - C_t) is, with S_t the running sum of A - C,
    S_t - min(-Q_0, min_k<=t S_k) (one cumsum and one running minimum)."""
    if work.size == 0:
        return np.zeros(0), np.zeros(0)
    q = np.asarray(q0, dtype=np.float64)[..., None]
    s = (work - service).cumsum(axis=-1)
    queue = s - np.minimum(-q, np.minimum.accumulate(s, axis=-1))
    np.maximum(queue, 0.0, out=queue)  # rounding only
    if q.shape[:-1] != queue.shape[:-1]:
        q = np.broadcast_to(q, (*queue.shape[:-1], 1))
    before = np.concatenate((q, queue[..., :-1]), -1)
    return queue, before + work - queue


def fluid_waits(work: FloatArray, served: FloatArray, slot: float) -> FloatArray:
    """Seconds the last request of each slot waits beyond the slot's end (given to every
    request of the slot): done when cumulative service reaches the cumulative work up to
    the slot, service spread evenly inside the slot that reaches it; work never served
    waits at least until the run's end."""
    n = len(work)
    if n == 0:
        return np.zeros(0)
    due, done = np.cumsum(work), np.cumsum(served)
    tol = 1e-9 * max(1.0, float(due[-1]))
    s = np.searchsorted(done, due - tol, side="left")
    s_c = np.minimum(s, n - 1)
    before = np.where(s_c > 0, done[np.maximum(s_c - 1, 0)], 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(served[s_c] > 0, (due - before) / served[s_c], 1.0)
    finished = np.where(s < n, (s_c + np.clip(frac, 0.0, 1.0)) * slot, n * slot)
    arrived = (np.arange(n) + 1.0) * slot
    return np.asarray(np.maximum(0.0, finished - arrived), dtype=np.float64)


def wait_figures(counts: FloatArray, waits: FloatArray, slo: float) -> tuple[float, float]:
    """p99 of the per-request wait and the share of requests waiting over `slo`, each
    slot weighted by its requests; (0, 0) when none arrived."""
    total = float(np.sum(counts))
    if total <= 0:
        return 0.0, 0.0
    order = np.argsort(waits, kind="stable")
    k = int(np.searchsorted(np.cumsum(counts[order]), 0.99 * total, side="left"))
    p99 = float(waits[order][min(k, len(order) - 1)])
    return p99, float(np.sum(counts[waits > slo]) / total)
