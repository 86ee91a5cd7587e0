"""Every baseline run of a sweep at once: the runs (a scaler kind at a target each) step
together through the simulated cluster's model, their state in arrays of shape (runs,)
and (runs, slots), one numpy operation per step for all of them.

Same model, same figures as one `SimulatedCluster` per run (`gpuscaler.sim.cluster`),
bit for bit (tests/test_sweep.py runs both): the runs share the arrivals, the signal
noise and the dropped samples (drawn from the same seed), each run draws its cold starts
from its own generator in the order a lone run does, and every float is computed by the
same operations in the same order. What a sweep leaves out, because no controller runs
in it: the controller's floor (min_replicas throughout), fragment changes (the pool's
initial fragments throughout, so no device-plugin disruption) and the pool's signals.

Per control interval: the pods' counts at the interval's first 500 ms sample for every
run (integers, however counted); only the runs whose pods start, turn ready or leave
inside the interval are counted sample by sample. The predictive floor's forecast reads
the demand alone, which no run changes: one per tick for all of its targets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gpuscaler.config import Config
from gpuscaler.core.model import FloatArray
from gpuscaler.sim.cluster import (
    SAMPLE,
    Recorder,
    SimulatedCluster,
    efficiency,
    layout_capacity,
)
from gpuscaler.sim.pods import Pods, PodTable
from gpuscaler.sim.queue import lindley
from gpuscaler.sim.scalers import (
    STABILIZATION,
    IntArray,
    ScalerKind,
    bounds,
    desired_replicas,
    predicted_loads,
    rate_loads,
)
from gpuscaler.sim.swept import SweepResult, held_gpus, same_model
from gpuscaler.sim.ticks import control_ticks

INF = math.inf
KEPT = ("capacity", "demand_busy", "replicas")
"""What a kept run records a slot at a time besides the served work and GPUs held, which
every run records (`Sweep._keep`); its queue and utilization are not kept (no figure and
no plot reads them of a run no controller ran)."""
RUN_SLOT_BYTES = 8 + 2
"""What every run of a sweep records a slot: the work served (float64) and the GPUs held
(`Sweep.gpu_sums`, int16 while a slot's sum fits it: `sums_dtype`)."""
SUMS_MOST = int(np.iinfo(np.int16).max)
"""The largest sum of a slot's GPUs `Sweep.gpu_sums` holds as int16."""


def sums_dtype(pods: int, sweep: Sweep) -> type[np.signedinteger[Any]]:
    """int16 when a slot's GPUs summed over its samples fit it at `pods` pods a run (at
    most ceil(pods / fragments) GPUs a sample), else int32."""
    gpus = -(-pods // sweep.c.fragments)
    return np.int16 if gpus * sweep.sub <= SUMS_MOST else np.int32


class Sweep:
    """Runs of the scalers `runs` (kind, target) on the arrivals of one replay, or, with
    `rows`, run i on the arrivals of `rows[i]` (replays of other workloads that share the
    template's model, `same_model`: many workloads' sweeps as one)."""

    def __init__(
        self,
        config: Config,
        template: SimulatedCluster,
        runs: Sequence[tuple[ScalerKind, float]],
        seed: int,
        rows: Sequence[SimulatedCluster] | None = None,
        record: Sequence[int] = (),
        replicas: Mapping[int, IntArray] | None = None,
    ):
        self.c = template  # the shared noise, dropped samples and settings
        rows = [template] * len(runs) if rows is None else list(rows)
        members = list({id(m): m for m in rows}.values())
        if len(rows) != len(runs) or not all(same_model(template, m) for m in members):
            raise ValueError("a sweep's rows need one replay a run, all of the template's model")
        where = {id(m): i for i, m in enumerate(members)}
        self.member = np.array([where[id(m)] for m in rows], dtype=np.int64)
        self.members = members
        self.work = np.stack([m.work for m in members])
        self.sim = config.simulator
        self.interval = config.control.interval
        self.horizon = config.forecast.horizon
        cfgs = [m.replicas_cfg for m in rows]
        self.lo = np.array([c.min_replicas for c in cfgs], dtype=np.int64)
        self.hi = np.array([c.max_replicas for c in cfgs], dtype=np.int64)
        self.tol = np.array([c.tolerance for c in cfgs], dtype=np.float64)
        self._scalers(runs)
        r, n = len(runs), len(template.arrivals)
        first = np.maximum(1, self.lo)
        self.pods = PodTable([Pods.running(int(f), template.start) for f in first])
        # Every run's cold starts come from its own generator of one seed: run r's kth
        # draw is the kth of one stream, drawn as far as the runs have come.
        self.cold_rng = np.random.default_rng(seed + 2)
        self.cold = np.zeros(0)
        self.drawn = np.zeros(r, dtype=np.int64)
        self.spec = first.copy()
        self.sub = max(1, math.ceil(template.slot / SAMPLE - 1e-9))
        self.served = np.full((r, n), np.nan)
        self.pods_fit = self.c.fragments * (SUMS_MOST // self.sub)
        """The most pods of a run whose GPUs' sums over a slot int16 holds."""
        self.gpu_sums = np.full((r, n), -1, dtype=sums_dtype(self.pods.created.shape[1], self))
        """The GPUs held in each slot summed over its 500 ms samples (`held_gpus`): int16,
        int32 once a run may hold more pods than int16 sums (`_fit_sums`; whole numbers
        either way, so the same figures)."""
        self.load = np.zeros((r, 0))
        """The utilization the HPA reads, of the slots from `load_from` to the cursor: at
        least the last control interval's (all the scalers read of it)."""
        self.load_from = 0
        self.q = np.zeros(r)
        self.capacity0, self.gpus0 = np.zeros(r), np.zeros(r)
        self.last_capacity = np.zeros(r)
        self.capacities = np.zeros(0)
        """`layout_capacity` at 0, 1, ... pods (`_capacity`)."""
        self.recs: list[tuple[float, IntArray]] = []
        self.events: list[tuple[float, IntArray, IntArray, IntArray]] = []
        """Each tick's replica changes: (time, runs, replicas before, after)."""
        self.cursor = 0
        self._keeping(record, replicas or {})

    def _scalers(self, runs: Sequence[tuple[ScalerKind, float]]) -> None:
        """Each run's scaler kind and target, and which signals its kind reads."""
        self.kinds = [k for k, _ in runs]
        self.targets = np.array([t for _, t in runs], dtype=np.float64)
        self.share = 1.0 / self.c.fragments
        self.share_targets = self.share * self.targets
        self.uses_util = np.isin(self.kinds, ("hpa_util", "predictive_floor"))
        self.uses_rate = np.isin(self.kinds, ("keda_rate",))
        self.uses_forecast = np.isin(self.kinds, ("predictive_floor",))

    def _keeping(self, record: Sequence[int], replicas: Mapping[int, IntArray]) -> None:
        """The runs `record` keep their whole record (`SweepResult.recorder`); the runs of
        `replicas` run no scaler: their replicas are set to the given count at each control
        tick, as `around.actual_run` sets them."""
        self.record = np.asarray(record, dtype=np.int64)
        n = len(self.c.arrivals)
        self.kept = {name: np.full((len(self.record), n), np.nan) for name in KEPT}
        self.held_last = np.zeros(len(self.record))
        f, overhead = self.c.fragments, self.sim.switch_overhead
        # The GPU efficiency at k pods holding a share, as `SimulatedCluster` computes it.
        self.eff = np.array(
            [float(efficiency(min(f, max(1.0, float(k))), overhead)) for k in range(f + 1)]
        )
        self.fixed = np.asarray(sorted(replicas), dtype=np.int64)
        self.fixed_counts = np.stack([replicas[int(i)] for i in self.fixed]) if replicas else None

    def run(self, start: float, seconds: float) -> list[SweepResult]:
        """Step every run as `simulate._run` steps one: advance, then the scaler, every
        control interval; then the rest up to the end."""
        ticks = control_ticks(start, seconds, self.interval)
        self._signals(ticks)
        for k, t in enumerate(ticks):
            self.advance_to(t)
            self.step(k, t)
        self.advance_to(start + seconds)
        kept = dict(zip(self.record.tolist(), self._recorders(), strict=True))
        changes = self._changes()
        out = []
        for i, (kind, target) in enumerate(zip(self.kinds, self.targets, strict=True)):
            rec = kept.get(i)
            # a kept run's own arrays: a row of the sweep's would hold all of them
            served = self.served[i] if rec is None else rec.served
            sums = self.gpu_sums[i] if rec is None else self.gpu_sums[i].copy()
            out.append(SweepResult(kind, float(target), served, sums, self.sub, changes[i], rec))
        return out

    def _recorders(self) -> list[Recorder]:
        """The kept runs' records: their served work and GPUs in arrays of their own (the
        sweep's tables of every run are freed with it), the rest rows of the tables of the
        kept runs alone (`KEPT`, no copy); what every run of a replay records alike too
        (its requests, its arrivals themselves, and its demand); its queue and
        utilization, which no figure reads, and the pool's signals, which no sweep
        computes (as a cluster no controller reads), are NaN, in a view that holds no
        memory."""
        out = []
        n, slot = self.cursor, self.c.slot
        unread = np.broadcast_to(np.nan, len(self.c.arrivals))
        for j, run in enumerate(self.record.tolist()):
            m = self.members[int(self.member[run])]
            rec = Recorder(0)
            rec.n = len(self.c.arrivals)
            for name in KEPT:  # rows of the kept runs' tables, let go with the last of them
                setattr(rec, name, self.kept[name][j])
            rec.served, rec.gpus = self.served[run].copy(), held_gpus(self.gpu_sums[run], self.sub)
            if n == rec.n:  # all slots run (as always in a replay): the arrivals themselves
                rec.requests = m.arrivals
            else:
                rec.requests = np.full(rec.n, np.nan)
                rec.requests[:n] = m.arrivals[:n]
            rec.demand_pct = np.full(rec.n, np.nan)
            rec.demand_pct[:n] = 100.0 * m.work[:n] / slot
            rec.pool_util = rec.stall = rec.queue = rec.load = unread
            out.append(rec)
        return out

    def _signals(self, ticks: list[float]) -> None:
        """The request rate and the predictive floor's forecast at every tick: they read
        the arrivals alone, the same in every run, so they are computed for all ticks at
        once (the cursor each tick leaves, as `advance_to` moves it)."""
        c = self.c
        steps = np.round((np.asarray(ticks) - c.start) / c.slot).astype(np.int64)
        cursors = np.maximum.accumulate(np.minimum(len(c.arrivals), np.maximum(steps, 0)))
        gps = self.sim.gpu_seconds_per_request
        runs = len(self.kinds)
        self.signal: FloatArray | None = None
        if self.uses_rate.any() or self.uses_forecast.any():
            zero = np.zeros((len(self.members), len(ticks)))
            rates = (
                np.stack([rate_loads(m.arrivals, cursors, c.slot, gps) for m in self.members])
                if self.uses_rate.any()
                else zero
            )
            predicted = (
                np.stack(
                    [
                        predicted_loads(100.0 * m.work / c.slot, cursors, c.slot, self.horizon)
                        for m in self.members
                    ]
                )
                if self.uses_forecast.any()
                else zero
            )
            # (ticks, 2 x members): each workload's rate, then its forecast, at each tick;
            # run i reads column `signal_of[i]` (its workload's rate or forecast)
            self.signal = np.ascontiguousarray(np.concatenate((rates, predicted)).T)
            self.signal_of = self.member + np.where(self.uses_rate, 0, len(self.members))
        # -1 (no recommendation) on the runs that read neither
        self.signal_off = np.where(self.uses_rate | self.uses_forecast, 0, -(2**40))
        self.none = np.full(runs, -1, dtype=np.int64)
        # the samples dropped before each slot, to tell a window without any
        self.drops = np.concatenate(([0], np.cumsum(c.dropped, dtype=np.int64)))

    def _pods_at(self, begin: int, end: int) -> tuple[FloatArray, FloatArray, FloatArray]:
        """`SimulatedCluster._pods_at` for every run, of the slots `begin` to `end`:
        (ready, capacity, GPUs held summed over each slot's `sub` samples: `held_gpus`), of
        shape (runs, slots), or (runs, 1) when no run's pods change in these slots."""
        c = self.c
        slot, f = c.slot, c.fragments
        sub = self.sub
        m = end - begin
        # The first and last 500 ms samples, as the grid below computes them.
        first, last = c.start + slot * begin, c.start + slot * (end - 1)
        if sub > 1:
            last = last + (slot / sub) * (sub - 1)

        def samples() -> FloatArray:
            t = np.asarray(c.start + slot * np.arange(begin, end), dtype=np.float64)
            return (t[:, None] + (slot / sub) * np.arange(sub)).ravel() if sub > 1 else t

        pods = self.pods
        touched, moving, r, h = pods.count(first, last, samples)
        if touched.size:  # their counts at the first sample, kept while they hold
            self.capacity0[touched] = self._capacity(pods.now_ready[touched])
            self.gpus0[touched] = np.ceil(pods.now_held[touched] / f)
        # A run without pod changes keeps its counts throughout (the others are replaced).
        ready, capacity, gpus = (
            pods.now_ready[:, None],
            self.capacity0[:, None],
            self.gpus0[:, None] * sub,
        )
        if moving.size:
            cap, g = self._capacity(r), np.ceil(h / f)
            if sub > 1:
                # the mean over each slot's samples (`ndarray.mean`'s sum, then / sub)
                shape = (len(moving), m, sub)
                r, cap = (np.add.reduce(a.reshape(shape), axis=2) / sub for a in (r, cap))
                g = g.reshape(len(moving), m, sub).sum(axis=2)
            ready, capacity, gpus = (np.repeat(a, m, axis=1) for a in (ready, capacity, gpus))
            ready[moving], capacity[moving], gpus[moving] = r, cap, g
        if self.record.size:  # pods holding a share at the last slot's first sample
            held = pods.now_held.copy()
            if moving.size:
                held[moving] = h[:, -sub]
            self.held_last = held[self.record]
        return ready, capacity, gpus

    def _capacity(self, ready: FloatArray) -> FloatArray:
        """`layout_capacity` of pod counts (whole numbers, at most a run's pods), looked up
        in a table of it at every count up to the table's width (elementwise, so the same
        bits), built again when the pods' table widens."""
        if len(self.capacities) <= self.pods.created.shape[1]:
            counts = np.arange(self.pods.created.shape[1] + 1, dtype=np.float64)
            self.capacities = layout_capacity(counts, self.c.fragments, self.sim.switch_overhead)
        return np.asarray(self.capacities[ready.astype(np.int64)])

    def advance_to(self, now: float) -> None:
        """`SimulatedCluster.advance_to` for every run: the slots in [cursor, now)."""
        c, slot = self.c, self.c.slot
        end = min(len(c.arrivals), round((now - c.start) / slot))
        if end <= self.cursor:
            return
        s = slice(self.cursor, end)
        ready, capacity, gpus = self._pods_at(self.cursor, end)
        work = self.work[0, s] if len(self.members) == 1 else self.work[:, s][self.member]
        queue, served = lindley(self.q, work, capacity * slot)
        self.q = queue[:, -1]
        scale = np.sqrt(np.maximum(ready / c.fragments, 1))
        load = np.maximum(0.0, 100.0 * served / slot + c.noise[s] * scale)
        load[:, c.dropped[s]] = np.nan
        self._fit_sums()
        self.served[:, s], self.gpu_sums[:, s] = served, gpus
        keep = round(self.interval / slot)
        if load.shape[1] < keep:  # the slots before these still read
            load = np.concatenate((self.load, load), axis=1)
        self.load = load[:, -keep:]
        self.load_from = end - self.load.shape[1]
        self.last_capacity = capacity[:, -1]
        if self.record.size:
            self._keep(s, capacity)
        self.cursor = end

    def _fit_sums(self) -> None:
        """`gpu_sums` as int32 once the pods' table is wider than int16 sums hold."""
        if self.gpu_sums.dtype == np.int16 and self.pods.created.shape[1] > self.pods_fit:
            self.gpu_sums = self.gpu_sums.astype(sums_dtype(self.pods.created.shape[1], self))

    def _keep(self, s: slice, capacity: FloatArray) -> None:
        """What `SimulatedCluster.advance_to` records of the kept runs for the slots `s`
        besides what every run records (`KEPT`; `capacity`: every run's)."""
        rows, kept, slot = self.record, self.kept, self.c.slot
        kept["capacity"][:, s] = capacity[rows]
        eff = self.eff[np.minimum(self.held_last, self.c.fragments).astype(np.int64)]
        kept["demand_busy"][:, s] = self.work[self.member[rows], s] / slot / eff[:, None]
        kept["replicas"][:, s] = self.spec[rows][:, None]

    def _recent(self, seconds: float) -> slice:
        return slice(max(0, self.cursor - round(seconds / self.c.slot)), self.cursor)

    def _wants(self, k: int, current: IntArray, ready: IntArray) -> IntArray:
        """`Scaler.step`'s answer before the bounds, for every run: the largest of the
        recommendations of its kind, `current` when it has none."""
        wants = self.none
        util = self._util()
        if util is not None:  # the dropped samples are the only missing ones, in every run
            asks = desired_replicas(
                util, self.share, current, ready, self.targets, self.tol, self.share_targets
            )
            wants = np.where(self.uses_util & (ready > 0), asks, wants)
        if self.signal is not None:  # the rate or the forecast, on runs that read one
            signal = self.signal[k][self.signal_of]
            asks = desired_replicas(
                signal, self.share, current, None, self.targets, self.tol, self.share_targets
            )
            wants = np.maximum(wants, asks + self.signal_off)
        return np.where(wants >= 0, wants, current)

    def _util(self) -> FloatArray | None:
        """Every run's mean utilization over the last control interval's samples not
        dropped (None: all dropped)."""
        window = self._recent(self.interval)
        count = window.stop - window.start
        if self.drops[window.stop] == self.drops[window.start] and count > 0:  # none dropped
            util = self.load[:, window.start - self.load_from : window.stop - self.load_from]
        else:
            finite = window.start + (~self.c.dropped[window]).nonzero()[0]
            if not finite.size:
                return None
            util, count = self.load[:, finite - self.load_from], finite.size
        # C order, as each lone run reduces its own row (an F-ordered copy sums otherwise).
        return np.asarray(np.add.reduce(np.ascontiguousarray(util), axis=1) / count)

    def step(self, k: int, now: float) -> None:
        """`SimulatedCluster.hpa_step` for every run, at the `k`th tick."""
        current = self.spec.copy()
        desired = bounds(
            self._wants(k, current, self.pods.ready_at(now)), current, self.lo, self.hi
        )
        self.recs = [(t, v) for t, v in self.recs if t > now - STABILIZATION]
        self.recs.append((now, desired))
        lower = desired < current
        if lower.any():  # scale-down only to the highest recommendation of the window
            held = np.maximum.reduce([v for _, v in self.recs])
            desired = np.where(lower, np.minimum(current, held), desired)
        desired = np.maximum(self.lo, desired)  # the floor: min_replicas
        if self.fixed_counts is not None:  # the replicas that ran, as given
            desired[self.fixed] = self.fixed_counts[:, k]
        changed = (desired != current).nonzero()[0]
        if changed.size:
            self._set_replicas(changed, now, current[changed], desired[changed])

    def _set_replicas(self, rows: IntArray, now: float, current: IntArray, n: IntArray) -> None:
        """`SimulatedCluster.set_replicas` for the runs `rows`, whose replicas change."""
        up, down = n > current, n < current
        more = n[up] - current[up]
        grow = (rows[up], more, self._cold_starts(rows[up], more))
        shrink = (rows[down], n[down], self._drain_seconds(rows[down]))
        self.pods.scale(now + self.sim.sync_delay, grow, shrink)
        self.spec[rows] = n
        self.events.append((now, rows, current, n))

    def _cold_starts(self, rows: IntArray, counts: IntArray) -> FloatArray:
        """The next `counts` cold starts of each run of `rows`, as its own generator draws
        them (`uniform(cold_start, cold_start_max, k)`: one double per draw, so draws of
        any sizes are one stream)."""
        if not rows.size:
            return np.zeros(0)
        first = self.drawn[rows]
        self.drawn[rows] += counts
        need = int(self.drawn[rows].max())
        if need > len(self.cold):
            more = max(need - len(self.cold), 256)
            drawn = self.cold_rng.uniform(self.sim.cold_start, self.sim.cold_start_max, more)
            self.cold = np.concatenate((self.cold, drawn))
        within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        return np.asarray(self.cold[np.repeat(first, counts) + within])

    def _drain_seconds(self, rows: IntArray) -> FloatArray:
        if self.cursor == 0:
            return np.zeros(len(rows))
        cap, q = self.last_capacity[rows], self.q[rows]
        with np.errstate(divide="ignore", invalid="ignore"):
            drain = np.minimum(self.sim.drain_max, q / cap)
        return np.where(cap <= 0, self.sim.drain_max, drain)

    def _changes(self) -> list[list[tuple[float, int, int]]]:
        """Each run's replica changes (time, before, after), in time order."""
        changes: list[list[tuple[float, int, int]]] = [[] for _ in self.kinds]
        for now, rows, before, after in self.events:
            for r, b, a in zip(rows.tolist(), before.tolist(), after.tolist(), strict=True):
                changes[r].append((now, b, a))
        return changes
