"""The pods of every run of the simulated cluster, as (runs, pods) arrays: when each was
created (holds its GPU share), turned ready (serves) and leaves (inf while it stays)."""

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
    """The pods of every run, padded with pods that never exist (all times infinite), each
    run starting with `first[run]` ready at `at`; with its counts as of `seen` and its next
    pod event, so that a run whose pods do not change is counted once a span (`count`)."""

    first: IntArray
    at: float
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
    """Per run: the columns its pods take (the rest is padding; pods gone before `seen`,
    counted nowhere, are dropped when it changes)."""

    def __post_init__(self) -> None:
        r = len(self.first)
        width = max(8, int(self.first.max(initial=0)))
        self.created, self.ready, self.leave = (np.full((r, width), INF) for _ in range(3))
        have = np.arange(width) < self.first[:, None]
        self.created[have] = self.ready[have] = self.at
        self.used = self.first.astype(np.int64)
        self.now_ready, self.now_held = np.zeros(r), np.zeros(r)
        self.next_event = np.where(self.first > 0, self.at, INF)

    def scale(
        self,
        at: float,
        up: tuple[IntArray, IntArray, FloatArray],
        down: tuple[IntArray, IntArray, FloatArray],
    ) -> None:
        """Replicas changed at `at`: `up` = (runs, pods each adds, their cold starts in run
        order), `down` = (runs, staying pods each keeps, drain seconds); no run in both."""
        rows = np.concatenate((up[0], down[0]))
        self._forget_gone(rows)
        if up[0].size:
            self._add(at, *up)
        if down[0].size:
            self._remove_newest(at, *down)
        w = self._cols(rows)
        events = np.concatenate(
            (self.created[rows, :w], self.ready[rows, :w], self.leave[rows, :w]), axis=1
        )
        self.next_event[rows] = np.where(events > self.seen, events, INF).min(axis=1)

    def _add(self, at: float, rows: IntArray, counts: IntArray, cold_starts: FloatArray) -> None:
        """`counts` new pods a run, created at `at`, ready after their cold starts; the
        tables made wider when short."""
        width = self.created.shape[1]
        need = int((self.used[rows] + counts).max())
        if need > width:
            pad = np.full((len(self.created), need + 8 - width), INF)
            self.created, self.ready, self.leave = (
                np.concatenate((a, pad), axis=1) for a in (self.created, self.ready, self.leave)
            )
        within = np.arange(len(cold_starts)) - np.repeat(np.cumsum(counts) - counts, counts)
        r = np.repeat(rows, counts)
        c = np.repeat(self.used[rows], counts) + within
        self.created[r, c] = at
        self.ready[r, c] = at + np.asarray(cold_starts, dtype=np.float64)
        self.used[rows] += counts

    def _remove_newest(self, at: float, rows: IntArray, keep: IntArray, drain: FloatArray) -> None:
        """All but each run's `keep` earliest-ready staying pods (ties: the earliest
        created) leave at `at`: a ready one after serving `drain` seconds more, one not
        serving yet at once."""
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
        """The runs' pods gone by `seen` dropped, the others kept in order."""
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

    def counts(self, t: FloatArray, rows: IntArray) -> tuple[FloatArray, FloatArray]:
        """(ready, holding a GPU share) of the runs `rows` at each time of `t`, of shape
        (rows, len(t))."""
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
    ) -> tuple[IntArray, FloatArray, FloatArray]:
        """(runs whose pods change in (first, last], their ready and GPU-holding pods at
        every sample of `samples()`, of shape (runs, samples)); the other runs' counts at
        `first` hold throughout (`now_ready`, `now_held`)."""
        touched = (self.next_event <= last).nonzero()[0]
        moving = np.zeros(0, dtype=np.int64)
        ready = held = np.zeros((0, 0))
        if not touched.size:
            self.seen = last
            return moving, ready, held
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
        return moving, ready, held
