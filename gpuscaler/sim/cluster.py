"""The simulated cluster under `gpuscaler.sim.load`'s model, for any number of runs stepped
together (arrays with a leading run axis). The runs share range, slot, settings and seed:
one draw of signal noise and dropped samples, the kth cold start of each from one stream."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuscaler.config import Config, ReplicasConfig
from gpuscaler.core.decisions import (
    Decision,
    FragmentsDecision,
    ReplicaFloorDecision,
    TimeSliceDecision,
)
from gpuscaler.core.model import FloatArray, Series
from gpuscaler.core.snapshot import RawPool, RawWorkload
from gpuscaler.sim.load import (
    SAMPLE,
    STALL_LEVEL_FACTOR,
    Waits,
    draws,
    efficiency,
    layout_capacity,
    lindley,
)
from gpuscaler.sim.pods import Pods
from gpuscaler.sim.records import RunView
from gpuscaler.sim.replay import scenario
from gpuscaler.sim.scalers import STABILIZATION, IntArray, bounds, desired_replicas

ROOM = 2048
"""Slots a `Window` takes beyond the window it keeps (one copy every ROOM slots)."""


@dataclass(frozen=True)
class RunSpec:
    """One run of the model: the replay whose arrivals it serves (`member`), its replica
    bounds and HPA target, its pool, and what is kept of it."""

    member: int
    replicas: ReplicasConfig
    target_pct: float
    fragments: int
    time_slice_level: str
    gpu_memory_gib: float
    uses_util: bool = True
    """Its HPA reads the utilization (a run on request rate reads only its signal)."""
    recorded: bool = False
    """Its capacity, demand and waits kept slot by slot (what a plot draws)."""
    observed: bool = False
    """A controller reads its pool's signals (computed for these runs alone)."""


def scenario_run(
    config: Config,
    member: int = 0,
    target_pct: float | None = None,
    uses_util: bool = True,
    recorded: bool = False,
    observed: bool = False,
) -> RunSpec:
    """A run of `config`'s scenario, its pool at its initial fragments, its HPA at
    `target_pct` (default: the workload's target)."""
    workload, pool = scenario(config)
    cfg = config.workload_section(workload.key, "replicas", ReplicasConfig)
    return RunSpec(
        member,
        cfg,
        cfg.target_utilization_pct if target_pct is None else target_pct,
        pool.initial_fragments or config.fragments.allowed[0],
        "medium" if pool.profile == "compute_bound" else "short",
        pool.gpu_memory_gib,
        uses_util,
        recorded,
        observed,
    )


class Window:
    """The last `keep` slots (at least) of some (runs, slots) signals, in a table of
    `keep + ROOM` slots from slot `offset`. When full, the kept slots move to a new table,
    so that no slot an earlier tick's series still views ever changes."""

    def __init__(self, runs: int, keep: int):
        self.keep, self.offset = keep, 0
        self.table = np.full((runs, keep + ROOM), np.nan)

    def room(self, begin: int, end: int) -> None:
        """Room for the slots `begin` to `end`."""
        if end - self.offset <= self.table.shape[1]:
            return
        offset = max(self.offset, begin - self.keep)
        table = np.full((len(self.table), max(self.keep + ROOM, end - offset)), np.nan)
        table[:, : begin - offset] = self.table[:, offset - self.offset : begin - self.offset]
        self.table, self.offset = table, offset

    def slots(self, begin: int, end: int) -> slice:
        return slice(begin - self.offset, end - self.offset)


class Clusters:
    """The simulated cluster of every run of `specs`, each on the arrivals of its member
    of `arrivals` (members, slots), from `start`; the figures scored from slot
    `scored_from`."""

    def __init__(
        self,
        config: Config,
        arrivals: FloatArray,
        start: float,
        seed: int,
        specs: Sequence[RunSpec],
        scored_from: int = 0,
    ):
        self.sim = config.simulator
        self.scored_from = scored_from
        self.slot, self.start = self.sim.slot, start
        self.interval = config.control.interval
        self.window_slots = int(config.metrics.window / self.slot)
        self.arrivals = np.atleast_2d(arrivals)
        self.n = self.arrivals.shape[1]
        self.specs = list(specs)
        runs = len(self.specs)
        self.member = np.array([s.member for s in specs], dtype=np.int64)
        noise, self.stall_noise, self.dropped = draws(seed, self.n)
        self.noise = noise * self.sim.noise_pct
        self.sub = max(1, math.ceil(self.slot / SAMPLE - 1e-9))
        cfgs = [s.replicas for s in specs]
        self.lo = np.array([c.min_replicas for c in cfgs], dtype=np.int64)
        self.hi = np.array([c.max_replicas for c in cfgs], dtype=np.int64)
        self.tol = np.array([c.tolerance for c in cfgs], dtype=np.float64)
        self.targets = np.array([s.target_pct for s in specs], dtype=np.float64)
        self.uses_util = np.array([s.uses_util for s in specs], dtype=bool)
        self.floor = self.lo.copy()
        self.fragments = np.array([s.fragments for s in specs], dtype=np.float64)
        self.levels = [s.time_slice_level for s in specs]
        self.disrupted_until = np.full(runs, -math.inf)
        first = np.maximum(1, self.lo)
        self.pods = Pods(first, start)
        self.spec = first.copy()
        self.cold_rng = np.random.default_rng(seed + 2)
        self.cold = np.zeros(0)
        self.drawn = np.zeros(runs, dtype=np.int64)
        self.q = np.zeros(runs)
        self.last_capacity, self.last_gpus = np.zeros(runs), np.zeros(runs)
        self.sums = np.zeros((3, runs))
        """GPUs held, under-provisioned slots and replicas asked, over the scored slots."""
        self.load = np.zeros((runs, 0))
        """The utilization the HPA reads, of the slots from `load_from` to the cursor."""
        self.load_from = 0
        self.recs: list[tuple[float, IntArray]] = []
        """Every run's HPA recommendations of the scale-down stabilization window."""
        self.events: list[tuple[float, IntArray, IntArray, IntArray]] = []
        """Each replica change: (time, runs, replicas before, after)."""
        self.fragment_changes: list[list[Decision]] = [[] for _ in specs]
        self.time_slice_changes: list[list[Decision]] = [[] for _ in specs]
        self.cursor = 0
        # The tables of the recorded runs and the observed ones' last metrics window.
        self.recorded = np.array([i for i, s in enumerate(self.specs) if s.recorded], np.int64)
        self.observed = np.array([i for i, s in enumerate(self.specs) if s.observed], np.int64)
        # capacity and demand_busy, in single precision (within the figures' rounding)
        self.kept = np.full((2, len(self.recorded), self.n), np.nan, dtype=np.float32)
        keep = max(self.window_slots, round(self.interval / self.slot))
        self.windows = {name: Window(len(self.observed), keep) for name in ("util", "stall")}
        self.row_of = {int(r): j for j, r in enumerate(self.observed)}
        work = self.arrivals * self.sim.gpu_seconds_per_request
        slo, member = self.sim.slo_wait, self.member
        self.waits = Waits(work, self.arrivals, member, self.slot, scored_from, slo, self.recorded)

    def advance_to(self, now: float) -> None:
        """Simulate every run's slots in [cursor time, now)."""
        end = min(self.n, round((now - self.start) / self.slot))
        if end <= self.cursor:
            return
        begin, slot = self.cursor, self.slot
        s = slice(begin, end)
        ready, capacity, gpus, held_last = self._pods_over(begin, end)
        work = self.arrivals[self.member, s] * self.sim.gpu_seconds_per_request
        queue, served = lindley(self.q, work, capacity * slot)
        self.q = queue[:, -1].copy()
        f = self.fragments[:, None]
        served_pct = 100.0 * served / slot
        load = np.maximum(0.0, served_pct + self.noise[s] * np.sqrt(np.maximum(ready / f, 1)))
        dropped = self.dropped[s]
        load[:, dropped] = np.nan
        keep = round(self.interval / slot)
        if load.shape[1] < keep:  # the slots before these still read
            load = np.concatenate((self.load, load), axis=1)
        self.load = load[:, -keep:]
        self.load_from = end - self.load.shape[1]
        gpus, capacity = (np.broadcast_to(a, served.shape) for a in (gpus, capacity))
        self.waits.feed(served)
        eff = efficiency(
            np.minimum(self.fragments, np.maximum(1.0, held_last)), self.sim.switch_overhead
        )
        busy, cap = (work / slot / eff[:, None]).astype(np.float32), capacity.astype(np.float32)
        k = min(end - begin, max(0, self.scored_from - begin))  # the first scored of these
        under = (busy[:, k:] > cap[:, k:] + 1e-9).sum(axis=1)
        self.sums += (gpus[:, k:].sum(axis=1), under, self.spec * (end - begin - k))
        self.last_capacity, self.last_gpus = capacity[:, -1].copy(), gpus[:, -1].copy()
        self.kept[:, :, s] = cap[self.recorded], busy[self.recorded]
        if self.observed.size:
            self._signals(begin, end, work, served_pct, gpus, eff)
        self.cursor = end

    def _signals(
        self,
        begin: int,
        end: int,
        work: FloatArray,
        served_pct: FloatArray,
        gpus: FloatArray,
        eff: FloatArray,
    ) -> None:
        """The observed runs' pool utilization and stall of the slots `begin` to `end`."""
        rows, s, slot = self.observed, slice(begin, end), self.slot
        held = np.maximum(gpus[rows], 1.0)
        noise = self.noise[s]
        util = np.clip(100.0 * work[rows] / slot / eff[rows, None] / held + noise, 0.0, None)
        busy = np.clip(served_pct[rows] / held, 0.0, 100.0)
        level = np.array([STALL_LEVEL_FACTOR[self.levels[r]] for r in rows.tolist()])
        term = np.log2(self.fragments[rows]) / 3.0 * level
        stall = 30.0 * (busy / 100.0) ** 2 * term[:, None]
        stall = np.clip(stall + self.stall_noise[s], 0.0, 100.0)
        dropped = self.dropped[s]
        util[:, dropped] = np.nan
        stall[:, dropped] = np.nan
        for name, values in (("util", util), ("stall", stall)):
            w = self.windows[name]
            w.room(begin, end)
            w.table[:, w.slots(begin, end)] = values

    def _pods_over(
        self, begin: int, end: int
    ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """(ready replicas, capacity in GPUs' worth, GPUs held) of every run in the slots
        `begin` to `end`, every 500 ms (means over a coarser slot), (runs, slots) or (runs,
        1) when none changes; and each run's GPU-holding pods at the last slot's start."""
        slot, sub, overhead = self.slot, self.sub, self.sim.switch_overhead
        m = end - begin
        first, last = self.start + slot * begin, self.start + slot * (end - 1)
        if sub > 1:
            last = last + (slot / sub) * (sub - 1)

        def samples() -> FloatArray:
            t = np.asarray(self.start + slot * np.arange(begin, end), dtype=np.float64)
            return (t[:, None] + (slot / sub) * np.arange(sub)).ravel() if sub > 1 else t

        pods = self.pods
        moving, r, h = pods.count(first, last, samples)
        disrupted = np.flatnonzero(self.disrupted_until > first)
        if disrupted.size and not np.isin(disrupted, moving).all():
            moving = np.union1d(moving, disrupted)
            r, h = pods.counts(samples(), moving)
        f = self.fragments
        ready = pods.now_ready[:, None]
        capacity = layout_capacity(pods.now_ready, f, overhead)[:, None]
        gpus = np.ceil(pods.now_held / f)[:, None]
        held_last = pods.now_held.copy()
        if moving.size:
            fm = f[moving, None]
            cap = layout_capacity(r, fm, overhead)
            disrupted_now = samples()[None, :] < self.disrupted_until[moving, None]
            cap = np.where(disrupted_now, cap * self.sim.fragment_disruption_capacity, cap)
            g = np.ceil(h / fm)
            held_last[moving] = h[:, -sub]
            if sub > 1:
                shape = (len(moving), m, sub)
                r, cap, g = (a.reshape(shape).sum(axis=2) / sub for a in (r, cap, g))
            ready, capacity, gpus = (np.repeat(a, m, axis=1) for a in (ready, capacity, gpus))
            ready[moving], capacity[moving], gpus[moving] = r, cap, g
        return ready, capacity, gpus, held_last

    def hpa_step(
        self, now: float, signal: FloatArray | None = None, fixed: IntArray | None = None
    ) -> None:
        """Every run's HPA at `now`; replicas = max(floor, its answer). `signal`: per run,
        the load (% of one GPU) read besides the utilization (NaN: none); `fixed`: per
        run, the replicas to set instead (-1: its HPA decides)."""
        current = self.spec.copy()
        ready = self.pods.ready_at(now)
        share = 1.0 / self.fragments
        wants = np.full(len(current), -1, dtype=np.int64)
        # Every run's mean utilization over the last control interval; the dropped samples
        # are the only missing ones, in every run.
        window = slice(max(0, self.cursor - round(self.interval / self.slot)), self.cursor)
        finite = window.start + (~self.dropped[window]).nonzero()[0]
        if finite.size:
            util = np.asarray(self.load[:, finite - self.load_from].mean(axis=1))
            asks = desired_replicas(util, share, current, ready, self.targets, self.tol)
            wants = np.where(self.uses_util & (ready > 0), asks, wants)
        if signal is not None:
            known = np.isfinite(signal)
            load = np.where(known, signal, 0.0)
            asks = desired_replicas(load, share, current, None, self.targets, self.tol)
            wants = np.where(known, np.maximum(wants, asks), wants)
        wants = np.where(wants >= 0, wants, current)  # no data: hold, as the HPA does
        desired = bounds(wants, current, self.lo, self.hi)
        self.recs = [(t, v) for t, v in self.recs if t > now - STABILIZATION]
        self.recs.append((now, desired))
        lower = desired < current
        if lower.any():  # scale-down only to the highest recommendation of the window
            highest = np.maximum.reduce([v for _, v in self.recs])
            desired = np.where(lower, np.minimum(current, highest), desired)
        desired = np.maximum(self.floor, desired)
        if fixed is not None:
            desired = np.where(fixed >= 0, fixed, desired)
        self.set_replicas(now, desired)

    def set_replicas(self, now: float, n: IntArray) -> None:
        """Every run's replicas asked at `now`, reached `sync_delay` later: new pods after
        their cold starts; the newest-ready leave, a ready one after draining the queue."""
        current = self.spec
        rows = np.flatnonzero(n != current)
        if not rows.size:
            return
        before, after = current[rows], np.asarray(n, dtype=np.int64)[rows]
        up, down = after > before, after < before
        more = after[up] - before[up]
        grow = (rows[up], more, self._cold_starts(rows[up], more))
        shrink = (rows[down], after[down], self._drain_seconds(rows[down]))
        self.pods.scale(now + self.sim.sync_delay, grow, shrink)
        self.spec = current.copy()
        self.spec[rows] = after
        self.events.append((now, rows, before, after))

    def _cold_starts(self, rows: IntArray, counts: IntArray) -> FloatArray:
        """The next `counts` cold starts of each run of `rows`, from its own place in one
        stream of the seed."""
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

    def apply(self, run: int, decisions: Sequence[Decision]) -> None:
        """A controller's decisions for run `run` (its floor, fragments, time slice)."""
        for d in decisions:
            match d:
                case ReplicaFloorDecision():
                    self.floor[run] = d.to_value
                    n = self.spec.copy()
                    n[run] = max(d.to_value, int(n[run]))
                    self.set_replicas(d.time, n)
                case FragmentsDecision():
                    self.fragments[run] = d.to_value
                    self.disrupted_until[run] = d.time + self.sim.fragment_disruption
                    self.fragment_changes[run].append(d)
                case TimeSliceDecision():
                    self.levels[run] = d.to_value
                    self.time_slice_changes[run].append(d)

    def signals(self, run: int, pool_name: str, workload_key: str) -> tuple[RawPool, RawWorkload]:
        """The last `metrics.window` of observed run `run`'s pool and workload signals."""
        end = self.cursor
        begin = max(0, end - self.window_slots)
        start, step, row = self.start + self.slot * begin, self.slot, self.row_of[run]
        util, stall = (self.windows[k] for k in ("util", "stall"))
        spec = self.specs[run]
        work = self.arrivals[spec.member, begin:end] * self.sim.gpu_seconds_per_request
        pool = RawPool(
            name=pool_name,
            utilization=Series(start, step, util.table[row, util.slots(begin, end)]),
            stall=Series(start, step, stall.table[row, stall.slots(begin, end)]),
            fragments=int(self.fragments[run]),
            time_slice_level=self.levels[run],
            gpu_memory_gib=spec.gpu_memory_gib,
            max_shares_held=0,
            gpus_held=int(self.last_gpus[run]) if end else None,
        )
        workload = RawWorkload(
            key=workload_key,
            load=Series(start, step, 100.0 * work / self.slot),
            floor=int(self.floor[run]),
            replicas=int(self.spec[run]),
            max_replicas=spec.replicas.max_replicas,
            replica_gpu_share=1.0 / float(self.fragments[run]),
        )
        return pool, workload

    def replica_changes(self) -> list[list[tuple[float, int, int]]]:
        """Each run's replica changes (time, before, after), in time order."""
        changes: list[list[tuple[float, int, int]]] = [[] for _ in self.specs]
        for now, rows, before, after in self.events:
            for r, b, a in zip(rows.tolist(), before.tolist(), after.tolist(), strict=True):
                changes[r].append((now, b, a))
        return changes

    def views(self) -> list[RunView]:
        """Every run's record (a run not recorded: its figures)."""
        changes = self.replica_changes()
        means = self.sums[1:] / max(1, self.cursor - self.scored_from)
        figures = np.vstack((*self.waits.finish(), self.sums[:1], means)).T.tolist()
        tables = (*self.kept, self.waits.waits)
        out = []
        for i, spec in enumerate(self.specs):
            j = self.waits.kept[i]  # its row in the tables, -1: none
            cap, busy, waits = (np.zeros(0),) * 3 if j < 0 else (t[j] for t in tables)
            head = (self.start, self.slot, self.cursor, self.arrivals[spec.member])
            p99, share, gpus, under, reps = figures[i]
            tail = (changes[i], self.fragment_changes[i], self.time_slice_changes[i])
            out.append(RunView(*head, cap, busy, waits, p99, share, gpus, under, reps, *tail))
        return out
