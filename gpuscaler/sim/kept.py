"""What the report reads of a finished run, so that its record can be let go.

A run's record is a few arrays of one value a slot; the summary reads a few figures of
it and the PNG a minute's means, the slots of requests over the SLO and the forecast's
band. `gpuscaler whatif` holds many runs at once (its lanes, then each one's reactive run
until its workload is reported): it keeps these instead (`simulate.release`): the same
figures and the same plot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuscaler.core.decisions import Decision
from gpuscaler.core.model import FloatArray
from gpuscaler.sim.queue import fluid_waits
from gpuscaler.sim.records import RunView

PLOT_MEAN_S = 60.0
"""The PNG draws demand and capacity as means over this many seconds."""


@dataclass(frozen=True)
class Plotted:
    """What the PNG draws of one run (`report._series`)."""

    hours: FloatArray
    demand: FloatArray
    capacity: FloatArray
    late: FloatArray
    """Hours into the replay of the slots whose requests wait over the SLO."""
    band: tuple[FloatArray, FloatArray, FloatArray] | None
    """The forecast's band at the horizon: (hours, lower, upper); None: no forecast."""
    marks: tuple[tuple[str, float], ...]
    """(kind, hours) of the fragment, time-slice and preemption decisions."""


@dataclass(frozen=True)
class Kept:
    """A released run's figures (`simulate.run_metrics`), span and plot."""

    metrics: dict[str, Any]
    slot: float
    cursor: int
    plotted: Plotted | None
    """None: released without its plot (no PNG asked)."""


MARKED = ("fragments", "time_slice", "preemption")


def plotted(
    cluster: RunView,
    track: tuple[Sequence[float], Sequence[float], Sequence[float]],
    decisions: Sequence[Decision],
    start: float,
    slo_wait: float,
    horizon: float,
) -> Plotted:
    """What the PNG draws of a run (`track`: the forecasts' origins, lower and upper
    bounds at the horizon)."""
    rec, n, slot = cluster.rec, cluster.cursor, cluster.slot
    per = max(1, round(PLOT_MEAN_S / slot))
    m = n // per * per
    hours = (np.arange(m // per) + 1) * per * slot / 3600
    demand = rec.demand_busy[:m].reshape(-1, per).mean(axis=1)
    capacity = rec.capacity[:m].reshape(-1, per).mean(axis=1)
    waits = fluid_waits(cluster.work[:n], rec.served[:n], slot)
    late = np.flatnonzero((waits > slo_wait) & (rec.requests[:n] > 0)) * slot / 3600
    origin, lower, upper = track
    band = None
    if origin:
        fx = (np.asarray(origin) + horizon - start) / 3600
        band = (fx, np.asarray(lower) / 100, np.asarray(upper) / 100)
    marks = tuple((d.kind, (d.time - start) / 3600) for d in decisions if d.kind in MARKED)
    return Plotted(hours, demand, capacity, late, band, marks)
