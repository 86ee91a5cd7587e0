"""The simulated workload's pods, as arrays: when each was created (holds its GPU
share), turned ready (serves) and leaves (inf while it stays). Arrays, not objects: a
week's replay asks for these counts at every control tick of dozens of runs."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gpuscaler.core.model import FloatArray
from gpuscaler.sim.scalers import IntArray

INF = math.inf


@dataclass
class Pods:
    created: FloatArray
    ready: FloatArray
    leave: FloatArray

    steady_until: float = field(default=-INF, init=False)
    """No pod is created, turns ready or leaves after `steady_from` up to this time
    (kept until the pods change)."""
    steady_from: float = field(default=INF, init=False)
    staying: int = field(default=-1, init=False)
    """spec_count, kept until the pods change (-1: not counted yet)."""

    @classmethod
    def running(cls, n: int, at: float) -> Pods:
        """`n` pods created and ready at `at`."""
        return cls(np.full(n, at), np.full(n, at), np.full(n, INF))

    def spec_count(self) -> int:
        """Pods not leaving (the replicas the workload asks for)."""
        if self.staying < 0:
            self.staying = int(np.count_nonzero(self.leave == INF))
        return self.staying

    def ready_count(self, now: float) -> int:
        return int(np.count_nonzero((self.ready <= now) & (now < self.leave)))

    def forget_gone(self, before: float) -> None:
        """Drop the pods gone at or before `before`."""
        keep = self.leave > before
        if not keep.all():
            self.created, self.ready, self.leave = (
                self.created[keep],
                self.ready[keep],
                self.leave[keep],
            )

    def steady(self, first: float, last: float) -> bool:
        """Whether no pod changes in (first, last]: the counts at `first` hold to `last`."""
        if not self.steady_from <= first < self.steady_until:
            events = np.concatenate((self.created, self.ready, self.leave))
            later = events[events > first]
            self.steady_from = first
            self.steady_until = float(later.min()) if later.size else INF
        return last < self.steady_until

    def counts(self, t: FloatArray) -> tuple[FloatArray, FloatArray]:
        """(ready, holding a GPU share) at each time of `t`."""
        gone = np.searchsorted(np.sort(self.leave), t, side="right")
        ready = np.searchsorted(np.sort(self.ready), t, side="right") - gone
        held = np.searchsorted(np.sort(self.created), t, side="right") - gone
        return ready.astype(np.float64), held.astype(np.float64)

    def add(self, at: float, cold_starts: FloatArray) -> None:
        """New pods created at `at`, each ready after its cold start."""
        n = len(cold_starts)
        self.steady_from, self.staying = INF, -1
        self.created = np.concatenate((self.created, np.full(n, at)))
        self.ready = np.concatenate((self.ready, at + np.asarray(cold_starts, dtype=np.float64)))
        self.leave = np.concatenate((self.leave, np.full(n, INF)))

    def remove_newest(self, keep: int, at: float, drain: float) -> None:
        """All but the `keep` earliest-ready staying pods leave at `at`: a ready one after
        serving `drain` seconds more, one not serving yet at once."""
        self.steady_from, self.staying = INF, -1
        staying = np.flatnonzero(self.leave == INF)
        going = staying[np.argsort(self.ready[staying], kind="stable")][keep:]
        ready = self.ready[going]
        leave = np.where(ready > at, at, at + drain)
        self.leave[going] = leave
        self.ready[going] = np.minimum(ready, leave)


@dataclass
class PodTable:
    """The pods of every run as (runs, pods) arrays, padded with pods that never exist
    (created, ready and leaving at infinity), mirroring one `Pods` per run; with each
    run's counts as of the last sample counted (`seen`) and its next pod event after it,
    so a run whose pods do not change is not counted again. Built from `pods`; after that
    the table is the pods (`scale`: every changing run at once, each
    run's pods in the order its `Pods` keeps them, so the same ones leave)."""

    pods: list[Pods]
    """The pods each run starts with."""
    created: FloatArray = field(init=False)
    ready: FloatArray = field(init=False)
    leave: FloatArray = field(init=False)
    seen: float = field(default=-INF, init=False)
    next_event: FloatArray = field(init=False)
    """Per run: its first pod event (created, ready or leaving) after `seen`."""
    now_ready: FloatArray = field(init=False)
    now_held: FloatArray = field(init=False)
    """Per run: ready and GPU-holding pods at `seen` (true until `next_event`)."""
    used: IntArray = field(init=False)
    """Per run: the columns its pods take (the rest is padding); pods gone before `seen`
    stay in them until the table runs out of room (they count nowhere: created, ready
    and gone before any time still asked)."""

    def __post_init__(self) -> None:
        r = len(self.pods)
        width = max(8, max(len(p.created) for p in self.pods))
        self.created, self.ready, self.leave = (np.full((r, width), INF) for _ in range(3))
        self.next_event, self.now_ready, self.now_held = np.zeros(r), np.zeros(r), np.zeros(r)
        self.used = np.zeros(r, dtype=np.int64)
        for i in range(r):
            self.refresh(i)

    def refresh(self, r: int) -> None:
        """Copy run `r`'s pods into its row, after they changed at a time after `seen`."""
        pods = self.pods[r]
        n = len(pods.created)
        if n > self.created.shape[1]:
            pad = np.full((len(self.pods), n), INF)
            self.created, self.ready, self.leave = (
                np.concatenate((a, pad), axis=1) for a in (self.created, self.ready, self.leave)
            )
        for table, column in (
            (self.created, pods.created),
            (self.ready, pods.ready),
            (self.leave, pods.leave),
        ):
            table[r, :n], table[r, n:] = column, INF
        self.used[r] = n
        events = np.concatenate((pods.created, pods.ready, pods.leave))
        later = events[events > self.seen]
        self.next_event[r] = later.min() if later.size else INF

    def scale(
        self,
        at: float,
        up: tuple[IntArray, IntArray, FloatArray],
        down: tuple[IntArray, IntArray, FloatArray],
    ) -> None:
        """The runs whose replicas change at `at`, all at once, each as its `Pods` would
        (`add` or `remove_newest`, then `forget_gone(seen)`): `up` = (runs, pods each
        adds, their cold starts in the order of the runs), `down` = (runs, staying pods
        each keeps, each run's drain seconds); no run in both."""
        rows = np.concatenate((up[0], down[0]))
        self._forget_gone(rows)
        if up[0].size:
            self._add(at, *up)
        if down[0].size:
            self._remove_newest(at, *down)
        self.next_event[rows] = self._next_events(rows, self.seen)

    def _add(self, at: float, rows: IntArray, counts: IntArray, cold_starts: FloatArray) -> None:
        """`Pods.add` for each run of `rows`: `counts` new pods created at `at`, ready
        after their cold starts."""
        self._room(rows, counts)
        within = np.arange(len(cold_starts)) - np.repeat(np.cumsum(counts) - counts, counts)
        r = np.repeat(rows, counts)
        c = np.repeat(self.used[rows], counts) + within
        self.created[r, c] = at
        self.ready[r, c] = at + np.asarray(cold_starts, dtype=np.float64)
        self.used[rows] += counts

    def _remove_newest(self, at: float, rows: IntArray, keep: IntArray, drain: FloatArray) -> None:
        """`Pods.remove_newest` for each run of `rows`: all but its `keep` earliest-ready
        staying pods leave at `at` (ties: the earliest created first), a ready one after
        serving its run's `drain` seconds more, one not serving yet at once."""
        width = self._cols(rows)
        ready = self.ready[rows, :width]
        staying = (self.leave[rows, :width] == INF) & (np.arange(width) < self.used[rows][:, None])
        order = np.argsort(np.where(staying, ready, INF), axis=1, kind="stable")
        rank = np.arange(width)
        going = (rank >= keep[:, None]) & (rank < staying.sum(axis=1)[:, None])
        i, j = np.nonzero(going)
        r, c = rows[i], order[i, j]
        was = self.ready[r, c]
        leave = np.where(was > at, at, at + drain[i])
        self.leave[r, c] = leave
        self.ready[r, c] = np.minimum(was, leave)

    def _cols(self, rows: IntArray) -> int:
        """The columns that hold the pods of the runs `rows` (at least one)."""
        return max(1, int(self.used[rows].max())) if rows.size else 1

    def _forget_gone(self, rows: IntArray) -> None:
        """`Pods.forget_gone(seen)` for the runs `rows`: their pods gone by `seen` (counted
        nowhere since) dropped, the others kept in order."""
        width = self._cols(rows)
        live = (self.leave[rows, :width] > self.seen) & (
            np.arange(width) < self.used[rows][:, None]
        )
        kept = live.sum(axis=1)
        some = kept != self.used[rows]
        if not some.any():
            return
        rows, live, kept = rows[some], live[some], kept[some]
        order = np.argsort(~live, axis=1, kind="stable")  # the live first, in order
        padding = np.arange(width) >= kept[:, None]
        for table in (self.created, self.ready, self.leave):
            moved = table[rows[:, None], order]
            moved[padding] = INF
            table[rows, :width] = moved
        self.used[rows] = kept

    def _room(self, rows: IntArray, counts: IntArray) -> None:
        """Room for `counts` more pods on the runs `rows`: the table wider if short."""
        width = self.created.shape[1]
        need = int((self.used[rows] + counts).max())
        if need > width:
            pad = np.full((len(self.created), need + 8 - width), INF)
            self.created, self.ready, self.leave = (
                np.concatenate((a, pad), axis=1) for a in (self.created, self.ready, self.leave)
            )

    def _next_events(self, rows: IntArray, after: float) -> FloatArray:
        w = self._cols(rows)
        events = np.concatenate(
            (self.created[rows, :w], self.ready[rows, :w], self.leave[rows, :w]), axis=1
        )
        return np.asarray(np.where(events > after, events, INF).min(axis=1))

    def counts_at(self, t: float, rows: IntArray) -> tuple[FloatArray, FloatArray]:
        """(ready, holding a GPU share) of the runs `rows` at `t` (`counts` at one time)."""
        ready, held = self.counts(np.array([t]), rows)
        return ready[:, 0], held[:, 0]

    def counts(self, t: FloatArray, rows: IntArray) -> tuple[FloatArray, FloatArray]:
        """(ready, holding a GPU share) of the runs `rows` at each time of `t`: arrays of
        shape (rows, len(t)), each run's as its `Pods` counts them (the same integers: a
        pod is counted from each of its times on, padding never)."""
        t, w = np.asarray(t)[None, None, :], self._cols(rows)
        gone = (self.leave[rows, :w][:, :, None] <= t).sum(axis=1)
        ready = (self.ready[rows, :w][:, :, None] <= t).sum(axis=1) - gone
        held = (self.created[rows, :w][:, :, None] <= t).sum(axis=1) - gone
        return ready.astype(np.float64), held.astype(np.float64)

    def ready_at(self, now: float) -> IntArray:
        """Replicas serving at `now` (not before `seen`), per run."""
        ready = self.now_ready.astype(np.int64)
        rows = (self.next_event <= now).nonzero()[0]
        if rows.size:
            w = self._cols(rows)
            serving = (self.ready[rows, :w] <= now) & (now < self.leave[rows, :w])
            ready[rows] = serving.sum(axis=1)
        return ready

    def count(
        self, first: float, last: float, samples: Callable[[], FloatArray]
    ) -> tuple[IntArray, IntArray, FloatArray, FloatArray]:
        """(runs counted again, runs whose pods change over the samples from `first` to
        `last` (start, turn ready or leave in (first, last]), the latter's counts at every
        sample of `samples()` (shape (runs changing, samples))); the other runs' counts
        at `first` hold throughout (`now_ready`, `now_held`)."""
        touched = (self.next_event <= last).nonzero()[0]
        moving = np.zeros(0, dtype=np.int64)
        ready = held = np.zeros((0, 0))
        if not touched.size:
            self.seen = last
            return touched, moving, ready, held
        # The touched runs' rows, taken once: (created, ready, leave) side by side.
        width = self._cols(touched)
        rows = np.concatenate(
            [t[touched, :width] for t in (self.created, self.ready, self.leave)], 1
        )
        at = (rows <= first).reshape(len(touched), 3, width).sum(axis=2)
        self.now_ready[touched] = at[:, 1] - at[:, 2]
        self.now_held[touched] = at[:, 0] - at[:, 2]
        changes = ((rows > first) & (rows <= last)).any(axis=1)
        moving = touched[changes]
        if moving.size:
            ready, held = self.counts(samples(), moving)
            self.now_ready[moving], self.now_held[moving] = ready[:, -1], held[:, -1]
        self.seen = last
        self.next_event[touched] = np.where(rows > last, rows, INF).min(axis=1)
        return touched, moving, ready, held
