"""What each lane's simulated cluster is now (replicas asked, floor, share, fragments, time
slice, and its pod counts while no pod changes), kept as arrays over the lanes of a
lockstep (`gpuscaler.sim.lanes`): read again from a lane's `SimulatedCluster` only after
it changed, not asked of every lane's cluster at every step.

A lane's cluster changes only through `SimulatedCluster.set_replicas` and `apply` (the
HPA's step and the controller's decisions), and each calls its `changed` hook, which puts
the lane on `changed` here. Its pod counts over a span of slots are the counts at the
span's first slot when its pods do not change over it (`SimulatedCluster.pods_over`'s
steady answer): kept with the span of time they hold for (from the pods' `steady_from`
to their `steady_until`), so a later span inside it gets the same floats without asking
the cluster; the cluster's own answer and caches are left exactly as they were (it is
asked whenever the span leaves the kept one, and then first of all).
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from gpuscaler.core.model import FloatArray
from gpuscaler.sim.cluster import SAMPLE, STALL_LEVEL_FACTOR, SimulatedCluster
from gpuscaler.sim.scalers import IntArray

INF = math.inf


class LaneState:
    """Each lane's state as arrays (index: the lane), fresh after `fresh()`."""

    def __init__(self, lanes: int):
        self.clusters: list[SimulatedCluster] = []
        self.changed: set[int] = set()
        """Lanes whose cluster changed since their state was read."""
        self.specs: IntArray = np.zeros(lanes, dtype=np.int64)
        """Replicas asked (`spec_count`)."""
        self.floors: IntArray = np.zeros(lanes, dtype=np.int64)
        self.shares: FloatArray = np.ones(lanes)
        self.fragments: list[int] = [1] * lanes
        self.levels: list[str] = [""] * lanes
        self.since = np.full(lanes, INF)
        self.until = np.full(lanes, -INF)
        """The pods' counts in `counts` hold from `since` to before `until` (-inf: none)."""
        self.counts = np.zeros((3, lanes))
        """(ready, capacity, GPUs held) while the pods do not change."""
        self.params = np.zeros((lanes, 4))
        """(fragments, efficiency, the stall's fragment term, stall level factor), as of
        the lane's last pod counts."""

    def add(self, i: int, c: SimulatedCluster) -> None:
        """Lane `i`'s cluster (lanes are added in order)."""
        self.clusters.append(c)
        c.changed = partial(self.changed.add, i)
        self.changed.add(i)

    def fresh(self) -> None:
        """The changed lanes' state read again, their kept pod counts dropped."""
        for i in self.changed:
            c = self.clusters[i]
            self.specs[i] = c.spec_count()
            self.floors[i] = c.floor
            self.shares[i] = c.share()
            self.fragments[i] = c.fragments
            self.levels[i] = c.time_slice_level
            self.until[i] = -INF
        self.changed.clear()

    def pods_over(
        self, start: float, slot: float, begin: int, end: int
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Every lane's `SimulatedCluster.pods_over(begin, end)`, one slot's counts
        repeated where they hold (lanes, end - begin): the kept counts where the span is
        inside the time they hold for, else the cluster's own (then kept if steady)."""
        self.fresh()
        sub = max(1, math.ceil(slot / SAMPLE - 1e-9))
        first = start + slot * begin  # the floats `pods_over` compares
        last = start + slot * (end - 1)
        if sub > 1:
            last = last + (slot / sub) * (sub - 1)
        held = (self.since <= first) & (last < self.until)
        k = end - begin
        ready, capacity, gpus = (np.repeat(col[:, None], k, axis=1) for col in self.counts)
        for i in np.flatnonzero(~held).tolist():
            c = self.clusters[i]
            ready[i], capacity[i], gpus[i] = c.pods_over(begin, end)
            self._kept(i, c, first, last)
        return ready, capacity, gpus

    def _kept(self, i: int, c: SimulatedCluster, first: float, last: float) -> None:
        """Lane `i`'s counts kept when its cluster answered from its steady counts (which
        then hold until its pods' next event), and its parameters as of now."""
        pods = c.pods
        if (
            c.steady_key == (pods.steady_from, c.fragments)
            and pods.steady_from <= first
            and last < pods.steady_until
            and not first < c.disrupted_until
        ):
            self.since[i], self.until[i] = pods.steady_from, pods.steady_until
            self.counts[:, i] = [float(x[0]) for x in c.steady]
        else:
            self.until[i] = -INF
        f = c.fragments
        self.params[i] = (
            f,
            c._efficiency(min(f, max(1.0, c.held_last))),
            math.log2(f) / 3.0,
            STALL_LEVEL_FACTOR[c.time_slice_level],
        )

    def ready_at(self, now: float) -> IntArray:
        """Every lane's `SimulatedCluster.ready_count(now)`: the kept count where it holds
        at `now`, else the cluster's."""
        self.fresh()
        ready: IntArray = self.counts[0].astype(np.int64)
        for i in np.flatnonzero(~((self.since <= now) & (now < self.until))).tolist():
            ready[i] = self.clusters[i].ready_count(now)
        return ready
