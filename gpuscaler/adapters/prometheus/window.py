"""Decoding and the window: the `data.result` matrix checked for shape, values parsed,
NaN/Inf flagged; per target a sliding window on the step grid, gaps NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np

from gpuscaler.adapters.prometheus.transport import SourceError
from gpuscaler.core.model import FloatArray, Series

PERCENT = (0.0, 100.0)
"""GPU utilization and stall are percentages: anything else is a broken exporter or rule."""
LOAD = (0.0, 100.0 * 100_000)
"""A workload's load sums its pods' GPU utilization: at most 100 % on each of 100,000 GPUs."""
MEMORY_MIB = (0.0, 1024.0 * 1024)
"""Frame buffer per GPU in MiB: no GPU has a TiB."""


# --------------------------------------------------------------------------- decoding


def drop_outside(values: FloatArray, bounds: tuple[float, float]) -> str | None:
    """A problem naming how many decoded `values` (non-finite already NaN) lie outside
    `bounds`, with one of them, and those values set to NaN; None when all are in."""
    lo, hi = bounds
    outside = (values < lo) | (values > hi)  # NaN compares False
    if not outside.any():
        return None
    bad = values[outside]
    values[outside] = np.nan
    return f"{bad.size} value(s) outside {lo:g}..{hi:g}, e.g. {bad[0]:g}: invalid input"


def decode_matrix(result: Any) -> tuple[FloatArray, FloatArray, bool]:
    """(times, values, had_non_finite) of a single-series matrix result, non-finite values
    NaN; several series are refused, an empty result gives empty arrays."""
    if not isinstance(result, list):
        raise SourceError("data.result is not a list")
    if len(result) == 0:
        return np.empty(0), np.empty(0), False
    if len(result) > 1:
        raise SourceError(f"query returned {len(result)} series, expected one aggregate")
    item = result[0]
    if not isinstance(item, dict) or not isinstance(item.get("values"), list):
        raise SourceError("result item has no values list")
    times, values = decode_points(item["values"])
    bad = ~np.isfinite(values)
    values[bad] = np.nan
    return times, values, bool(bad.any())


def decode_points(points: list[Any]) -> tuple[FloatArray, FloatArray]:
    """(times, values) of a series' [timestamp, "value"] points, each converted by
    `float`, one column at a time; SourceError when a point is not of that form."""
    n = len(points)
    try:
        times = np.fromiter(map(float, map(itemgetter(0), points)), np.float64, n)
        values = np.fromiter(map(float, map(itemgetter(1), points)), np.float64, n)
    except (TypeError, ValueError, IndexError, KeyError):
        raise SourceError('a sample is not [timestamp, "value"]') from None
    return times, values


def decode_vector(result: Any) -> tuple[float | None, bool]:
    """(value, non_finite) of a single-series instant-vector result; None when empty,
    several series refused."""
    if not isinstance(result, list):
        raise SourceError("data.result is not a list")
    if len(result) == 0:
        return None, False
    if len(result) > 1:
        raise SourceError(f"query returned {len(result)} series, expected one aggregate")
    item = result[0]
    sample = item.get("value") if isinstance(item, dict) else None
    if not (isinstance(sample, list) and len(sample) == 2 and isinstance(sample[1], str)):
        raise SourceError('the sample is not [timestamp, "value"]')
    try:
        value = float(sample[1])
    except ValueError:
        raise SourceError(f"the sample value {sample[1][:20]!r} is not a number") from None
    return (value, False) if np.isfinite(value) else (None, True)


# --------------------------------------------------------------------------- window


@dataclass
class Window:
    """One target's samples on the grid k * step, covering the last `window` seconds."""

    step: float
    size: int
    end: float | None = None  # grid time of the last slot
    values: FloatArray = field(default_factory=lambda: np.empty(0))
    fetched_until: float | None = None

    def advance(self, end: float) -> None:
        """Move the window to end at `end`, keeping what overlaps, NaN for the rest."""
        new = np.empty(self.size)  # a new array: Series handed out earlier keep theirs
        keep = 0
        if self.end is not None and self.values.size:
            shift = round((end - self.end) / self.step)
            keep = self.size - shift
            if 0 < keep <= self.size:
                new[:keep] = self.values[shift:]
            elif shift <= 0:
                new, keep = self.values.copy(), self.size
            else:
                keep = 0
        new[keep:] = np.nan
        self.values, self.end = new, end

    def write(self, times: FloatArray, values: FloatArray) -> None:
        assert self.end is not None
        idx = np.rint((times - self.end) / self.step).astype(np.int64)
        idx += self.size - 1
        ok = (idx >= 0) & (idx < self.size)
        if ok.all():  # the usual answer: nothing outside the window to drop
            self.values[idx] = values
        else:
            self.values[idx[ok]] = values[ok]

    def empty(self) -> bool:
        """No sample in the window (`series().last_sample_time() is None`)."""
        return not np.isfinite(self.values).any()

    def series(self) -> Series:
        assert self.end is not None
        return Series(
            start=self.end - self.step * (self.size - 1), step=self.step, values=self.values
        )
