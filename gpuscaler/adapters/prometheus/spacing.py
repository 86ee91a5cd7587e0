"""The real sample spacing of each Prometheus series, and the lookback that fits it.

Queries read `last_over_time(x[{lookback}])` on the `metrics.step` grid with a lookback
of two steps, so that a missed scrape stays a gap. A series scraped more coarsely (15 s
against the 500 ms step) comes back as short runs of points one scrape apart; once
measured it is read with a lookback of that spacing plus two steps, so its buckets have
no holes, and the controller says so once per series.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import numpy as np

from gpuscaler.core.model import FloatArray

log = logging.getLogger("gpuscaler.prometheus")

MIN_RUNS = 4
"""Runs of points needed before a spacing is believed: three intervals agreeing."""
MAX_RUN = 3
"""Points one sample yields at the default lookback of two steps (two, three on an edge):
longer runs are contiguous data, and the holes between them outages, not a scrape."""
REGULAR = 0.5
"""Share of run intervals within 25 % of their median for the holes to be a scrape
interval rather than scattered outages."""


def measure_spacing(times: FloatArray, step: float) -> float | None:
    """The sample spacing behind points returned on a `step` grid at a lookback of two
    steps (the median interval between run starts), None when the points show no scrape
    interval: contiguous, too few runs, long runs with outages between them, or irregular."""
    if times.size < MIN_RUNS:
        return None
    t = np.sort(times)
    breaks = np.flatnonzero(np.diff(t) > 1.5 * step)
    first = np.concatenate(([0], breaks + 1))
    if first.size < MIN_RUNS:
        return None
    lengths = np.diff(np.concatenate((first, [t.size])))
    if np.median(lengths) > MAX_RUN:
        return None
    intervals = np.diff(t[first])
    spacing = float(np.median(intervals))
    if np.mean(np.abs(intervals - spacing) <= 0.25 * spacing) < REGULAR:
        return None
    return spacing if spacing > 1.5 * step else None


def lookback_ms(step: float, spacing: float | None) -> str:
    """The `{lookback}` of a query: two steps, plus the measured spacing."""
    seconds = 2 * step + (spacing or 0.0)
    return f"{max(1, math.ceil(seconds * 1000))}ms"


RECHECK_EVERY = 10
"""A series found fine is measured again every this many reads: scrape intervals change
with a redeploy, not by the tick."""

SpacingListener = Callable[[str, float, float], None]
"""Told (series key, measured spacing, metrics.step) once per coarse series."""


class SpacingTracker:
    """Measured spacings of the series read so far, each announced once."""

    def __init__(self, step: float) -> None:
        self.step = step
        self.measured: dict[str, float] = {}
        """Series key -> sample spacing in seconds, for series coarser than the step."""
        self.listeners: list[SpacingListener] = []
        self._fine: dict[str, int] = {}
        """Series found fine -> reads left before measuring again."""

    def lookback(self, key: str) -> str:
        return lookback_ms(self.step, self.measured.get(key))

    def observe(self, key: str, times: FloatArray | Callable[[], FloatArray]) -> bool:
        """Record the spacing behind `times` (a callable is called only when measured);
        True when the series turns out coarser than the step for the first time."""
        if key in self.measured:
            return False
        left = self._fine.get(key, 0)
        if left > 0:
            self._fine[key] = left - 1
            return False
        spacing = measure_spacing(times() if callable(times) else times, self.step)
        if spacing is None:
            self._fine[key] = RECHECK_EVERY - 1
            return False
        self._fine.pop(key, None)
        self.measured[key] = spacing
        log.warning(
            "%s: samples are %gs apart, coarser than metrics.step %gs (a scrape interval); "
            "reading each point from the newest sample within %gs instead of seeing gaps",
            key,
            spacing,
            self.step,
            spacing + 2 * self.step,
            extra={"event": "coarse_samples", "series": key, "spacing_seconds": spacing},
        )
        for listener in self.listeners:
            listener(key, spacing, self.step)
        return True

    def reset(self, step: float, keep: Callable[[str], bool]) -> None:
        """A new config: all measured again on a new grid; series gone are forgotten."""
        if step != self.step:
            self.step = step
            self.measured.clear()
            self._fine.clear()
        for key in [k for k in self.measured if not keep(k)]:
            del self.measured[key]
        self._fine = {k: n for k, n in self._fine.items() if keep(k)}
