"""The simulated workload's pods, as arrays: when each was created (holds its GPU
share), turned ready (serves) and leaves (inf while it stays). Arrays, not objects: a
week's replay asks for these counts at every control tick of dozens of runs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gpuscaler.core.model import FloatArray

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
