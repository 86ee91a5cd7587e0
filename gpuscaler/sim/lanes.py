"""The simulated clusters of all lanes of a lockstep (`gpuscaler.sim.lockstep`), advanced
together: one tick of every lane's queue, signals and records, and of every lane's HPA, as
array operations with a lane axis, not one small numpy call per lane per step.

Each lane stays a `SimulatedCluster` (its pods, decisions, replica changes; the controller
reads it through `observe`, the report through its records): its per-slot inputs and
records become rows of (lanes, slots) tables here (`cluster.rec.load` is a view of
`self.rec["load"][lane]`), so whatever reads one lane reads what this wrote. The steps
are the single cluster's operations on the same floats (elementwise, or along each row as
the lone row is reduced), so every lane's figures are those of its cluster advanced
alone (tests/test_lanes.py compares them record for record).

What a lane's cluster still does alone: its pod counts (`SimulatedCluster.pods_over`:
one cached answer while its pods do not change), a replica change (`set_replicas`), and
the load of an HPA window holding a dropped sample (the lone mean of the finite ones).

The lanes' noise: every lane draws it from the run's seed, so the lanes of one lockstep
hold the same noise, drop mask and stall noise; one copy is kept for all when they are
equal (a lane-week at 10 s slots: about 1 MB less a lane). A lane's recorded requests
are its arrivals themselves (the same values up to the cursor, all of them at the end), as
the baselines' sweep records them (0.5 MB less a lane-week).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpuscaler.core.model import FloatArray, Series
from gpuscaler.core.snapshot import RawPool, RawWorkload
from gpuscaler.sim.cluster import RECORDED, Recorder, SimulatedCluster
from gpuscaler.sim.lane_state import LaneState
from gpuscaler.sim.queue import lindley
from gpuscaler.sim.scalers import STABILIZATION, IntArray, bounds, desired_replicas

WINDOWED = ("queue", "load", "pool_util", "stall")
"""Records no report reads: kept over the last window the controller (the pool's
signals) and the HPA (the load) read, in `Window`s; NaN once the run ends."""
STEPPED = ("demand_busy", "replicas")
"""Records read only once the run ends (its figures, its plot), each a step function of
the lane: the replicas it asked (they change at a replica change) and its work over its
efficiency (which changes with its fragments). Kept as the changes, built whole when
read (`LaneRecorder`): 2 x 8 bytes a slot less a lane (about 1 MB a lane-week)."""
TABLED = tuple(name for name in RECORDED if name not in ("requests", *WINDOWED, *STEPPED))
"""The records kept whole as (lanes, slots) tables (a lane's requests are its arrivals)."""
ROOM = 2048
"""Slots a `Window` takes beyond the window it keeps (one copy every ROOM slots)."""


class Window:
    """The last `keep` slots (at least) of some (lanes, slots) records: a table of
    `keep + ROOM` slots from slot `offset`. When full, the kept slots move to a new
    table: the old one stays as it is for whatever still holds a view of it (the
    controller's series of earlier ticks), so no slot once written ever changes."""

    def __init__(self, lanes: int, keep: int):
        self.keep, self.offset = keep, 0
        self.table = np.full((lanes, keep + ROOM), np.nan)

    def room(self, begin: int, end: int) -> bool:
        """Make room for the slots `begin` to `end` (the kept ones before them moved
        when short): whether the table is new."""
        if end - self.offset <= self.table.shape[1]:
            return False
        offset = max(self.offset, begin - self.keep)
        table = np.full((len(self.table), max(self.keep + ROOM, end - offset)), np.nan)
        table[:, : begin - offset] = self.table[:, offset - self.offset : begin - self.offset]
        self.table, self.offset = table, offset
        return True

    def slots(self, begin: int, end: int) -> slice:
        return slice(begin - self.offset, end - self.offset)


class Steps:
    """A step function over slots of every lane: (first slot, value) at each change."""

    def __init__(self, lanes: int):
        self.last = np.full(lanes, np.nan)
        self.changes: list[list[tuple[int, float]]] = [[] for _ in range(lanes)]

    def put(self, begin: int, values: FloatArray) -> None:
        """Each lane's value from slot `begin` on (NaN before its first)."""
        for i in np.flatnonzero(values != self.last).tolist():
            self.changes[i].append((begin, float(values[i])))
        self.last = values

    def row(self, lane: int, n: int, cursor: int) -> FloatArray:
        """Lane `lane`'s values of `n` slots, those from `cursor` on NaN."""
        out = np.full(n, np.nan)
        changes = self.changes[lane]
        if changes and cursor > 0:
            begins = [b for b, _ in changes] + [cursor]
            out[begins[0] : cursor] = np.repeat([v for _, v in changes], np.diff(begins))
        return out


class LaneRecorder(Recorder):
    """A lane's record: the (lanes, slots) tables' rows and windows (set by
    `LaneClusters`), and the `STEPPED` ones built whole each time they are read."""

    def __init__(self, batch: LaneClusters, lane: int):  # no per-slot array of its own
        self.n, self._batch, self._lane = batch.n, batch, lane

    def __getattr__(self, name: str) -> FloatArray:
        if name in STEPPED:
            return self._batch.stepped(name, self._lane)
        raise AttributeError(name)


def batchable(clusters: Sequence[SimulatedCluster]) -> bool:
    """Whether these clusters can advance together: one range, slot and simulator
    config, nothing simulated yet, all observed, none with a preemption burst, every
    one under the HPA on utilization (no shared predictions)."""
    if not clusters:
        return False
    first = clusters[0]
    return all(
        c.start == first.start
        and c.slot == first.slot
        and len(c.arrivals) == len(first.arrivals)
        and c.sim == first.sim
        and c.cursor == 0
        and c.observed
        and c.preemption is None
        and c.scaler.kind == "hpa_util"
        and c.scaler.predicted is None
        and not c.scaler.recs
        and c.scaler.interval == first.scaler.interval
        and c.window_slots == first.window_slots
        for c in clusters
    )


NOISE = ("noise", "stall_noise", "dropped")
"""A cluster's per-slot draws: one row for all lanes while they are equal."""


class LaneClusters:
    """Every lane's `SimulatedCluster`, advanced and stepped together: the first one's,
    room for `lanes`, then each `add`ed as soon as it is built (its own records are
    dropped for rows of the lanes' tables, so a lockstep never holds both)."""

    def __init__(self, first: SimulatedCluster, lanes: int):
        if lanes < 1 or not batchable([first]):
            raise ValueError("these clusters cannot advance together (see `batchable`)")
        self.clusters: list[SimulatedCluster] = []
        self.start, self.slot, self.n = first.start, first.slot, len(first.arrivals)
        self.sim = first.sim
        self.cursor = 0
        self.q = np.zeros(lanes)
        self.work = np.empty((lanes, self.n))
        self.noise, self.stall_noise = first.noise[None, :], first.stall_noise[None, :]
        self.dropped = first.dropped[None, :]
        self.rec = {name: np.full((lanes, self.n), np.nan) for name in TABLED}
        self.steps = {name: Steps(lanes) for name in STEPPED}
        keep = max(first.window_slots, round(first.scaler.interval / self.slot))
        self.windows = {name: Window(lanes, keep) for name in WINDOWED}
        self.recs: list[tuple[float, IntArray]] = []
        """The HPA's recommendations of the stabilization window, every lane's at once."""
        self.scaling: tuple[FloatArray, FloatArray, IntArray, IntArray] | None = None
        """Each lane's HPA (target, tolerance, min and max replicas), once all are in."""
        self.state = LaneState(lanes)
        self.add(first)

    @classmethod
    def of(cls, clusters: Sequence[SimulatedCluster]) -> LaneClusters:
        """All of `clusters` (already built) together."""
        if not clusters:
            raise ValueError("these clusters cannot advance together (see `batchable`)")
        batch = cls(clusters[0], len(clusters))
        for c in clusters[1:]:
            batch.add(c)
        return batch

    def add(self, c: SimulatedCluster) -> None:
        """The next lane: its work, draws and records become rows of the lanes' tables."""
        i = len(self.clusters)
        if i >= len(self.q) or not batchable([self.clusters[0] if i else c, c]):
            raise ValueError("these clusters cannot advance together (see `batchable`)")
        self.clusters.append(c)
        self.work[i] = c.work
        c.work = self.work[i]
        for name in NOISE:
            table, mine = getattr(self, name), getattr(c, name)
            if len(table) == 1 and not np.array_equal(table[0], mine):  # a row each now
                table = np.repeat(table, len(self.q), axis=0)
                setattr(self, name, table)
                for j, d in enumerate(self.clusters[:-1]):
                    setattr(d, name, table[j])
            if len(table) > 1:
                table[i] = mine
            setattr(c, name, table[min(i, len(table) - 1)])
        # The requests recorded are the arrivals: the same values up to the cursor (all
        # of them once the run ends; nothing reads past the cursor before).
        self.state.add(i, c)
        c.rec = LaneRecorder(self, i)
        c.rec.requests = c.arrivals
        for name in TABLED:
            setattr(c.rec, name, self.rec[name][i])
        for name, w in self.windows.items():
            setattr(c.rec, name, w.table[i])
        c.signals_from = self.windows["pool_util"].offset

    def advance_to(self, now: float) -> None:
        """`SimulatedCluster.advance_to(now)` of every lane (all added)."""
        if len(self.clusters) != len(self.q):
            raise ValueError(f"{len(self.clusters)} of {len(self.q)} lanes added")
        end = min(self.n, round((now - self.start) / self.slot))
        if end <= self.cursor:
            return
        begin = self.cursor
        pods = self.state.pods_over(self.start, self.slot, begin, end)
        self._record(begin, end, pods, self.state.params)
        for c, q in zip(self.clusters, self.q.tolist(), strict=True):
            c.cursor = end
            c.q = q
        self.cursor = end

    def _record(
        self,
        begin: int,
        end: int,
        pods: tuple[FloatArray, FloatArray, FloatArray],
        lane: FloatArray,
    ) -> None:
        """The slots `begin` to `end` of every lane from its pod counts and its row of
        `lane`: (fragments, efficiency, stall's fragment term, stall level factor)."""
        ready, capacity, gpus = pods
        f, eff, level = lane[:, :1], lane[:, 1:2], lane[:, 2:]
        idx, slot, rec = slice(begin, end), self.slot, self.rec
        if any([w.room(begin, end) for w in self.windows.values()]):
            self._windows_to_lanes()
        work = self.work[:, idx]
        queue, served = lindley(self.q, work, capacity * slot)
        self.q = queue[:, -1].copy()
        demand_pct = 100.0 * work / slot
        noise = self.noise[:, idx]
        served_pct, held = 100.0 * served / slot, np.maximum(gpus, 1.0)  # each used twice
        load = np.maximum(0.0, served_pct + noise * np.sqrt(np.maximum(ready / f, 1)))
        dropped = self.dropped[:, idx]  # NaN where dropped (broadcast over the lanes)
        np.copyto(load, np.nan, where=dropped)
        pool_util = np.clip(demand_pct / eff / held + noise, 0.0, None)
        busy = np.clip(served_pct / held, 0.0, 100.0)
        stall = 30.0 * (busy / 100.0) ** 2 * level[:, :1]
        stall *= level[:, 1:]
        stall = np.clip(stall + self.stall_noise[:, idx], 0.0, 100.0)
        np.copyto(pool_util, np.nan, where=dropped)
        np.copyto(stall, np.nan, where=dropped)
        for name, values in (("queue", queue), ("load", load), ("pool_util", pool_util)):
            w = self.windows[name]
            w.table[:, w.slots(begin, end)] = values
        w = self.windows["stall"]
        w.table[:, w.slots(begin, end)] = stall
        self.steps["demand_busy"].put(begin, lane[:, 1].copy())
        rec["demand_pct"][:, idx] = demand_pct
        rec["capacity"][:, idx] = capacity
        rec["served"][:, idx] = served
        rec["gpus"][:, idx] = gpus
        self.steps["replicas"].put(begin, self.state.specs.astype(np.float64))

    def stepped(self, name: str, lane: int) -> FloatArray:
        """Lane `lane`'s record `name` (one of `STEPPED`) as its cluster records it: NaN
        from the cursor on."""
        values = self.steps[name].row(lane, self.n, self.cursor)
        if name == "demand_busy":  # the work of each slot over the efficiency then
            s = slice(0, self.cursor)
            values[s] = self.work[lane, s] / self.slot / values[s]
        return values

    def signals(self, names: Sequence[str]) -> tuple[list[RawPool], list[RawWorkload]]:
        """Every lane's `SimulatedCluster.signals(names[lane])` (the same values; its
        series are views of the same slots), read from the lanes' tables at once."""
        state, end, cs = self.state, self.cursor, self.clusters
        state.fresh()
        begin = max(0, end - cs[0].window_slots)
        start, step = self.start + self.slot * begin, self.slot
        util, stall = self.windows["pool_util"], self.windows["stall"]
        held: list[int | None] = [None] * len(cs)
        if end:
            held = [int(g) for g in self.rec["gpus"][:, end - 1].tolist()]
        pools = [
            RawPool(
                name,
                Series(start, step, u),
                Series(start, step, s),
                f,
                level,
                c.gpu_memory_gib,
                gpus_held=g,
            )
            for name, c, u, s, f, level, g in zip(
                names,
                cs,
                util.table[:, util.slots(begin, end)],
                stall.table[:, stall.slots(begin, end)],
                state.fragments,
                state.levels,
                held,
                strict=True,
            )
        ]
        workloads = [
            RawWorkload(
                c.workload_key,
                Series(start, step, d),
                floor,
                spec,
                c.replicas_cfg.max_replicas,
                share,
            )
            for c, d, floor, spec, share in zip(
                cs,
                self.rec["demand_pct"][:, begin:end],
                state.floors.tolist(),
                state.specs.tolist(),
                state.shares.tolist(),
                strict=True,
            )
        ]
        return pools, workloads

    def _windows_to_lanes(self) -> None:
        """Each lane's windowed records: its rows of the windows' tables."""
        for i, c in enumerate(self.clusters):
            for name, w in self.windows.items():
                setattr(c.rec, name, w.table[i])
            c.signals_from = self.windows["pool_util"].offset

    def finish(self) -> None:
        """After the last slot: the windowed records NaN (in a view that holds no
        memory), the windows freed."""
        unread = np.broadcast_to(np.nan, self.n)
        for c in self.clusters:
            for name in WINDOWED:
                setattr(c.rec, name, unread)
            c.signals_from = 0
        self.windows = {}

    def hpa_step(self, now: float) -> None:
        """`SimulatedCluster.hpa_step(now)` of every lane: each HPA's answer, its
        scale-down stabilization, and the floor under it."""
        cs, state = self.clusters, self.state
        ready = state.ready_at(now)  # the lanes' state fresh from here on
        current, share = state.specs.copy(), state.shares.copy()
        load, known = self._util_loads()
        if self.scaling is None:
            cfg = [c.scaler.cfg for c in cs]
            self.scaling = (
                np.array([c.scaler.target_pct for c in cs]),
                np.array([x.tolerance for x in cfg]),
                np.array([x.min_replicas for x in cfg], dtype=np.int64),
                np.array([x.max_replicas for x in cfg], dtype=np.int64),
            )
        target, tol, lo, hi = self.scaling
        asks = known & (ready > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            wanted = desired_replicas(np.where(asks, load, 0.0), share, current, ready, target, tol)
        desired = bounds(np.where(asks, wanted, current), current, lo, hi)
        self.recs = [(t, v) for t, v in self.recs if t > now - STABILIZATION] + [(now, desired)]
        highest = np.maximum.reduce([v for _, v in self.recs])
        desired = np.where(desired < current, np.minimum(current, highest), desired)
        wants = np.maximum(state.floors, desired)
        for i in np.flatnonzero(wants != current):
            cs[i].set_replicas(now, int(wants[i]))

    def _util_loads(self) -> tuple[FloatArray, np.ndarray]:
        """Each lane's HPA load (the mean of the finite loads of its last interval) and
        whether it has one: the rows without a dropped sample as one mean over rows, the
        others each as the lone scaler takes it."""
        window = round(self.clusters[0].scaler.interval / self.slot)
        w = self.windows["load"]
        rows = w.table[:, w.slots(max(0, self.cursor - window), self.cursor)]
        if rows.shape[1] == 0:
            return np.zeros(len(self.clusters)), np.zeros(len(self.clusters), dtype=bool)
        finite = np.isfinite(rows)
        whole = finite.all(axis=1)
        load = np.zeros(len(self.clusters))
        load[whole] = rows[whole].mean(axis=1)
        known = whole.copy()
        for i in np.flatnonzero(~whole):
            values = rows[i][finite[i]]
            if values.size:
                load[i], known[i] = float(values.mean()), True
        return load, known
