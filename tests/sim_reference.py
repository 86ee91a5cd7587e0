"""The simulator's code as it was before it was rewritten for speed (branch `sim5`), kept
as the oracle its rewrites are checked against bit for bit (tests/test_sim_rewrites.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gpuscaler.core.model import Series
from gpuscaler.sim.around import held
from gpuscaler.sim.scalers import IntArray


def while_ticks(start: float, interval: float, end: float) -> list[float]:
    """The control-tick loop as simulate, lockstep, sweep and around each wrote it."""
    ticks = []
    t = start + interval
    while t <= end:
        ticks.append(t)
        t += interval
    return ticks


def actual_counts(replicas: Series, ticks: Sequence[float]) -> IntArray:
    """The replicas that ran at each tick, one tick at a time in Python."""
    counts = held(replicas)
    last = len(counts) - 1
    return np.array(
        [
            max(
                1,
                round(
                    float(
                        counts[min(max(math.floor((t - replicas.start) / replicas.step), 0), last)]
                    )
                ),
            )
            for t in ticks
        ],
        dtype=np.int64,
    )
