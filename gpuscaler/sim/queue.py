"""Queue maths of the simulator: a fluid FIFO queue between 500 ms slots.

Work that capacity cannot serve in a slot waits for the next one; it is never dropped.
All quantities are GPU-seconds of busy time. Vectorised: the Lindley recursion

    Q_t = max(0, Q_{t-1} + A_t - C_t)

over a block of slots with a carried Q_0 is, with S_t = sum_{k<=t} (A_k - C_k),

    Q_t = S_t - min(-Q_0, min_{1<=k<=t} S_k)

(one cumsum and one running minimum). A request's wait follows from cumulative work and
cumulative service: FIFO, a request is done when the cumulative service reaches the
cumulative work up to and including it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpuscaler.core.model import FloatArray


def lindley(
    q0: float | FloatArray, work: FloatArray, service: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Queue left at the end of each slot and work served in it, from `q0` queued
    before the first slot, `work` arriving and `service` capacity in each slot. Several
    queues at once: `q0` of shape (queues,), `service` of shape (queues, slots) (`work`
    broadcast against it), the answers of shape (queues, slots)."""
    if work.size == 0:
        return np.zeros(0), np.zeros(0)
    q = np.asarray(q0, dtype=np.float64)[..., None]
    s = (work - service).cumsum(axis=-1)
    queue = s - np.minimum(-q, np.minimum.accumulate(s, axis=-1))
    np.maximum(queue, 0.0, out=queue)  # rounding only
    if q.shape[:-1] != queue.shape[:-1]:
        q = np.broadcast_to(q, (*queue.shape[:-1], 1))
    before = np.concatenate((q, queue[..., :-1]), -1)
    served = before + work - queue
    return queue, served


def fluid_waits(work: FloatArray, served: FloatArray, slot: float) -> FloatArray:
    """Seconds the last request arriving in each slot waits beyond the end of that slot
    (every request of a slot is given that wait: a bound within one slot).

    Its work is done when cumulative service reaches cumulative work up to the end of
    its slot; inside the slot that reaches it, service is spread evenly. Work never
    served within the run waits at least until the run's end."""
    n = len(work)
    if n == 0:
        return np.zeros(0)
    due = np.cumsum(work)
    done = np.cumsum(served)
    tol = 1e-9 * max(1.0, float(due[-1]))
    s = np.searchsorted(done, due - tol, side="left")
    s_c = np.minimum(s, n - 1)
    before = np.where(s_c > 0, done[np.maximum(s_c - 1, 0)], 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(served[s_c] > 0, (due - before) / served[s_c], 1.0)
    frac = np.clip(frac, 0.0, 1.0)
    finished = np.where(s < n, (s_c + frac) * slot, n * slot)
    arrived = (np.arange(n) + 1.0) * slot
    return np.asarray(np.maximum(0.0, finished - arrived), dtype=np.float64)


def wait_figures(counts: FloatArray, waits: FloatArray, slo: float) -> tuple[float, float]:
    """p99 of the per-request wait and the share of requests waiting longer than `slo`,
    each slot's requests weighted by their count. (0, 0) when no request arrived."""
    total = float(np.sum(counts))
    if total <= 0:
        return 0.0, 0.0
    order = np.argsort(waits, kind="stable")
    cum = np.cumsum(counts[order])
    k = int(np.searchsorted(cum, 0.99 * total, side="left"))
    p99 = float(waits[order][min(k, len(order) - 1)])
    share = float(np.sum(counts[waits > slo]) / total)
    return p99, share


def slo_figures(
    run: tuple[FloatArray, FloatArray, FloatArray, Sequence[tuple[float, int, int]]],
    requests: FloatArray,
    slot: float,
    start: float,
    scored_from: int,
    slo: float,
) -> dict[str, Any]:
    """`slo_metrics` of a run given as (work, served and GPUs held per slot, replica
    changes (time, from, to)), with the requests arriving per slot."""
    work, served, gpus, replica_changes = run
    s = slice(scored_from, len(work))
    waits = fluid_waits(work, served, slot)[s]
    p99, share = wait_figures(requests[s], waits, slo)
    t0 = start + scored_from * slot
    changes = [c for c in replica_changes if c[0] >= t0]
    directions = [1 if new > old else -1 for _, old, new in changes]
    return {
        "slo_violation_share": round(share, 6),
        "p99_wait_s": round(p99, 3),
        "gpu_hours": round(float(np.nansum(gpus[s], dtype=np.float64)) * slot / 3600, 3),
        "scaling_actions": len(changes),
        "direction_reversals": sum(1 for a, b in itertools.pairwise(directions) if a != b),
    }
