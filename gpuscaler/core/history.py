"""What a workload's Prometheus history holds over a what-if range: frozen observations
filled by `adapters/prometheus/history.py`, replayed by `whatif/history.py`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuscaler.core.model import Series


@dataclass(frozen=True, eq=False)
class Signal:
    """One signal read over the range (None when no series matched) and where from."""

    name: str
    query: str
    series: Series | None
    problem: str | None = None
    """Why it could not be read (a failed query); None when it was, or simply absent."""


@dataclass(frozen=True, eq=False)
class WorkloadHistory:
    key: str
    start: float
    end: float
    step: float
    requests: Signal
    """Requests per second (`workload_requests`)."""
    load: Signal
    """GPU load, percent of one GPU, summed over the pods."""
    replicas: Signal


def gaps(series: Series, min_steps: int = 2) -> list[tuple[float, float]]:
    """(first missing time, last missing time) of each run of at least `min_steps` NaN
    samples: holes in the history the replay interpolates over."""
    missing = ~np.isfinite(series.values)
    if not missing.any():
        return []
    edges = np.diff(np.concatenate(([0], missing.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return [
        (series.start + a * series.step, series.start + (b - 1) * series.step)
        for a, b in zip(starts, ends, strict=True)
        if b - a >= min_steps
    ]


def native_resolution(series: Series) -> float:
    """Seconds between value changes the series really holds (a downsampled range repeats
    each value): the median run of equal consecutive finite values, times the step."""
    values = series.values[np.isfinite(series.values)]
    if values.size < 3:
        return series.step
    change = np.flatnonzero(np.diff(values) != 0)
    if change.size < 2:
        return series.step * values.size
    runs = np.diff(change)
    return float(np.median(runs)) * series.step
