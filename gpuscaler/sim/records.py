"""What is kept of a simulated run: its record as the figures and the plot read it
(`RunView`), and the last window of an observed run's signals (`Window`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from gpuscaler.core.decisions import Decision
from gpuscaler.core.model import FloatArray

if TYPE_CHECKING:
    from gpuscaler.sim.preemption import SimulatedPreemption

EMPTY = np.zeros(0)
ROOM = 2048
"""Slots a `Window` takes beyond the window it keeps (one copy every ROOM slots)."""


class Window:
    """The last `keep` slots (at least) of some (runs, slots) signals: a table of
    `keep + ROOM` slots from slot `offset`. When full, the kept slots move to a new
    table: the old one stays as it is for whatever still holds a view of it (the
    controller's series of earlier ticks), so no slot once written ever changes."""

    def __init__(self, runs: int, keep: int):
        self.keep, self.offset = keep, 0
        self.table = np.full((runs, keep + ROOM), np.nan)

    def room(self, begin: int, end: int) -> None:
        """Make room for the slots `begin` to `end` (the kept ones before them moved
        to a new table when short)."""
        if end - self.offset <= self.table.shape[1]:
            return
        offset = max(self.offset, begin - self.keep)
        table = np.full((len(self.table), max(self.keep + ROOM, end - offset)), np.nan)
        table[:, : begin - offset] = self.table[:, offset - self.offset : begin - self.offset]
        self.table, self.offset = table, offset

    def slots(self, begin: int, end: int) -> slice:
        return slice(begin - self.offset, end - self.offset)


@dataclass
class Record:
    """A run's per-slot arrays: the work served (GPU-seconds) and the GPUs held in each
    slot, the requests arriving, and, of a recorded run, the ready capacity (GPUs'
    worth), the work arriving in GPUs busy at the current sharing and the replicas
    asked (empty for a run not recorded)."""

    served: FloatArray
    gpus: np.ndarray
    requests: FloatArray
    slot: float = 1.0
    gpu_seconds_per_request: float = 1.0
    capacity: FloatArray = field(default_factory=lambda: EMPTY)
    demand_busy: FloatArray = field(default_factory=lambda: EMPTY)
    replicas: FloatArray = field(default_factory=lambda: EMPTY)

    @property
    def demand_pct(self) -> FloatArray:
        """The work arriving in each slot, in percent of one GPU."""
        work = self.requests * self.gpu_seconds_per_request
        return np.asarray(100.0 * work / self.slot, dtype=np.float64)


@dataclass
class RunView:
    """One run's record and what it did, as the figures and the plot read it."""

    start: float
    slot: float
    cursor: int
    """Slots simulated."""
    arrivals: FloatArray
    work: FloatArray
    """GPU-seconds of work arriving in each slot."""
    rec: Record
    replica_changes: Sequence[tuple[float, int, int]]
    fragment_changes: Sequence[Decision] = ()
    time_slice_changes: Sequence[Decision] = ()
    preemption: SimulatedPreemption | None = None
    """The preemption burst's simulated pool (`sim.preemption`), when the run had one."""

    def emptied(self) -> RunView:
        """The view without its per-slot arrays (the arrivals stay: the replay's own)."""
        rec = Record(EMPTY, EMPTY, EMPTY)
        return RunView(
            self.start,
            self.slot,
            self.cursor,
            self.arrivals,
            EMPTY,
            rec,
            self.replica_changes,
            self.fragment_changes,
            self.time_slice_changes,
            self.preemption,
        )
