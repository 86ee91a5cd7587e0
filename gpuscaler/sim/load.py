"""The simulator's load model, in slots of `simulator.slot` (docs/evaluation.md states it
in full): Poisson arrivals at the trace's interpolated rate, each request
`gpu_seconds_per_request` of work on a whole GPU, a fluid FIFO queue that drops nothing,
k tenants time-slicing a GPU losing `switch_overhead` of throughput per doubling, noisy
signals with 0.2 % of samples dropped, and a stall of 30 % x utilization^2 x log2(f)/3
scaled by the time slice level."""

from __future__ import annotations

import numpy as np

from gpuscaler.core.model import FloatArray, IntArray
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


P99 = 0.99


class Waits:
    """The fluid FIFO queue's waits of runs fed their service as they advance: a slot's
    last request waits until cumulative service reaches the work arrived up to the slot
    (spread evenly inside the slot reaching it), or until the end. Of the slots from
    `scored_from`, a run tallies the requests over `slo` and keeps the waits with at most
    1 % of its requests above them (its p99 among them); the runs `kept`, every wait."""

    def __init__(
        self,
        work: FloatArray,
        arrivals: FloatArray,
        member: IntArray,
        slot: float,
        scored_from: int,
        slo: float,
        kept: IntArray,
    ):
        self.due = np.cumsum(work, axis=1)  # (members, slots): the work arrived so far
        self.tol = 1e-9 * np.maximum(1.0, self.due[:, -1] if work.shape[1] else 0.0)
        self.arrivals, self.member, self.slot, self.slo = arrivals, member, slot, slo
        self.scored_from, self.fed, runs = scored_from, 0, len(member)
        self.done, self.late = np.zeros(runs), np.zeros(runs)  # work served, requests late
        self.first = np.zeros(runs, dtype=np.int64)  # each run's first slot still waiting
        self.total = arrivals[:, scored_from:].sum(axis=1)[member]
        self.top = [(np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0))]  # run, wait, requests
        self.new = 0  # candidates added since the last pruning
        self.kept = np.full(runs, -1, dtype=np.int64)
        self.kept[kept] = np.arange(len(kept))
        self.waits = np.full((len(kept), work.shape[1]), np.nan)
        self.runs_of = [np.flatnonzero(member == u) for u in range(len(work))]

    def feed(self, served: FloatArray) -> None:
        """The work each run served in the next slots (runs, slots)."""
        b0, m = self.fed, served.shape[1]
        done = np.cumsum(np.concatenate((self.done[:, None], served), axis=1), axis=1)
        # Only slots whose work the service so far may reach can finish now.
        reach = np.empty(len(done), dtype=np.int64)
        for member, rows in enumerate(self.runs_of):
            top = done[rows, -1] + 2 * self.tol[member]
            reach[rows] = np.searchsorted(self.due[member], top, "right")
        r, i = _spans(self.first, np.maximum(np.minimum(reach, b0 + m) - self.first, 0))
        u = self.member[r]
        # The slot that reaches each: searchsorted in each run's cumulative service.
        s = (done[r] < (self.due[u, i] - self.tol[u])[:, None]).sum(axis=1)
        reached = s <= m  # a prefix of each run's slots
        r, i, s, u = r[reached], i[reached], s[reached], u[reached]
        col = np.maximum(s - 1, 0)
        before, during = done[r, col], served[r, col]
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(during > 0, (self.due[u, i] - before) / during, 1.0)
        finished = (b0 + s - 1 + np.clip(frac, 0.0, 1.0)) * self.slot
        # s == 0: reached before these slots, so before its own end
        wait = np.where(s > 0, np.maximum(0.0, finished - (i + 1.0) * self.slot), 0.0)
        self.first += np.bincount(r, minlength=len(done))
        self.done, self.fed = done[:, -1].copy(), b0 + m
        self._add(r, i, wait)

    def finish(self) -> tuple[FloatArray, FloatArray]:
        """The runs' end (the work still waiting waits until then): each run's p99 wait and
        share of its requests over the SLO, each slot weighted by its requests."""
        r, i = _spans(self.first, self.fed - self.first)
        self.first[:] = self.fed
        self._add(r, i, np.maximum(0.0, self.fed * self.slot - (i + 1.0) * self.slot))
        runs, waits, counts, above = self._ranked()
        ok = self.total[runs] - above >= P99 * self.total[runs]  # 99 % waited at most this
        r, w = runs[ok], waits[ok]
        last = np.diff(r, append=-1) != 0  # the least such wait of each run
        p99 = np.zeros(len(self.total))
        p99[r[last]] = w[last]
        below = self.total - np.bincount(runs, counts, len(self.total))
        p99[below >= P99 * self.total] = 0.0
        return p99, self.late / np.maximum(self.total, 1.0)  # whole requests: none, or >= 1

    def _add(self, r: IntArray, i: IntArray, wait: FloatArray) -> None:
        mine = self.kept[r] >= 0
        self.waits[self.kept[r[mine]], i[mine]] = wait[mine]
        scored = i >= self.scored_from
        r, i, wait = r[scored], i[scored], wait[scored]
        requests = self.arrivals[self.member[r], i]
        over = wait > self.slo
        self.late += np.bincount(r[over], weights=requests[over], minlength=len(self.late))
        some = (wait > 0) & (requests > 0)
        self.top.append((r[some], wait[some], requests[some]))
        self.new += int(some.sum())
        if self.new > max(len(self.top[0][0]), len(self.late)):
            # Those kept are outnumbered: keep those with at most 1 % (and a margin) above.
            runs, waits, counts, above = self._ranked()
            keep = above <= self.total[runs] * (1 - P99) * 1.001
            self.top, self.new = [(runs[keep], waits[keep], counts[keep])], 0

    def _ranked(self) -> tuple[IntArray, FloatArray, FloatArray, FloatArray]:
        """The candidates by run, largest first, with the run's requests waiting longer."""
        runs, waits, counts = (np.concatenate(x) for x in zip(*self.top, strict=True))
        order = np.lexsort((-waits, runs))
        runs, waits, counts = runs[order], waits[order], counts[order]
        new = np.r_[True, (runs[1:] != runs[:-1]) | (waits[1:] != waits[:-1])]
        start = np.r_[True, runs[1:] != runs[:-1]]
        above = counts.cumsum() - counts
        above -= np.maximum.accumulate(np.where(start, above, 0.0))
        tied = np.maximum.accumulate(np.where(new, np.arange(runs.size), 0))
        return runs, waits, counts, above[tied]


def _spans(first: IntArray, count: IntArray) -> tuple[IntArray, IntArray]:
    """(row, index) of every index of each row's span [first, first + count)."""
    rows = np.repeat(np.arange(len(count)), count)
    starts = np.repeat(count.cumsum() - count, count)
    return rows, np.repeat(first, count) + np.arange(rows.size) - starts
