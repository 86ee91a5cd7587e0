"""Decoding and the window: a range answer decoded into arrays as it arrives (shape
checked, values parsed, NaN/Inf flagged); per target a window of `forecast.fit_step`
buckets (sum and count of the finite samples) on the grid k * fit_step, with the newest
samples raw until no read can send them again (`seal`), so a sample read twice is
counted once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from gpuscaler.adapters.prometheus.transport import SourceError
from gpuscaler.core.model import FloatArray, Series

PERCENT = (0.0, 100.0)
LOAD = (0.0, 100.0 * 100_000)
"""A workload's load sums its pods' GPU utilization: at most 100 % on each of 100,000 GPUs."""
MEMORY_MIB = (0.0, 1024.0 * 1024)
"""Frame buffer per GPU in MiB: no GPU has a TiB."""


def drop_outside(values: FloatArray, bounds: tuple[float, float]) -> str | None:
    """Values outside `bounds` set to NaN, and a problem naming them (None when all in)."""
    lo, hi = bounds
    outside = (values < lo) | (values > hi)  # NaN compares False
    if not outside.any():
        return None
    bad = values[outside]
    values[outside] = np.nan
    return f"{bad.size} value(s) outside {lo:g}..{hi:g}, e.g. {bad[0]:g}: invalid input"


@dataclass(frozen=True, eq=False)
class Samples:
    """One series of a range answer: labels, times and values (non-finite ones NaN), or
    why it is malformed."""

    metric: dict[str, str]
    times: FloatArray
    values: FloatArray
    non_finite: bool = False
    error: str | None = None


def decode_range(result: Any) -> list[Samples]:
    """Every series of a range `data.result`; a malformed one keeps its error, so that
    only the targets it answers fail."""
    if not isinstance(result, list):
        raise SourceError("data.result is not a list")
    return [_samples(item) for item in result]


def _samples(item: Any) -> Samples:
    none = np.empty(0)
    if not isinstance(item, dict) or not isinstance(item.get("values"), list):
        return Samples({}, none, none, error="result item has no values list")
    metric = item.get("metric")
    labels = {str(k): str(v) for k, v in metric.items()} if isinstance(metric, dict) else {}
    try:
        times, values = decode_points(item["values"])
    except SourceError as e:
        return Samples(labels, none, none, error=str(e))
    bad = ~np.isfinite(values)
    values[bad] = np.nan
    return Samples(labels, times, values, bool(bad.any()))


def one_series(answer: list[Samples]) -> tuple[FloatArray, FloatArray, bool]:
    """(times, values, had_non_finite) of an answer of one aggregate series (or none)."""
    if len(answer) == 0:
        return np.empty(0), np.empty(0), False
    if len(answer) > 1:
        raise SourceError(f"query returned {len(answer)} series, expected one aggregate")
    (series,) = answer
    if series.error is not None:
        raise SourceError(series.error)
    return series.times, series.values, series.non_finite


def decode_matrix(result: Any) -> tuple[FloatArray, FloatArray, bool]:
    return one_series(decode_range(result))


def decode_points(points: list[Any]) -> tuple[FloatArray, FloatArray]:
    """(times, values) of a series' [timestamp, "value"] points."""
    n = len(points)
    try:
        times = np.fromiter(map(float, map(itemgetter(0), points)), np.float64, n)
        values = np.fromiter(map(float, map(itemgetter(1), points)), np.float64, n)
    except (TypeError, ValueError, IndexError, KeyError):
        raise SourceError('a sample is not [timestamp, "value"]') from None
    return times, values


def decode_vector(result: Any) -> tuple[float | None, bool]:
    """(value, non_finite) of an instant result of one aggregate series (None: empty)."""
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


def bucket_index(times: FloatArray, width: float) -> npt.NDArray[np.int64]:
    """k of the bucket each time falls in: bucket k holds ((k - 1) * width, k * width]."""
    return np.ceil(times / width - 1e-9).astype(np.int64)


@dataclass
class Buckets:
    """Sum and count of finite samples in the buckets `first`, `first + 1`, ..."""

    width: float
    first: int
    sums: FloatArray
    counts: FloatArray

    @classmethod
    def empty(cls, width: float, first: int, size: int) -> Buckets:
        return cls(width, first, np.zeros(size), np.zeros(size))

    def add(self, times: FloatArray, values: FloatArray) -> None:
        """The finite samples added to the buckets they fall in (others left out)."""
        ok = np.isfinite(values)
        idx = bucket_index(times[ok], self.width) - self.first
        inside = (idx >= 0) & (idx < self.sums.size)
        idx, kept = idx[inside], values[ok][inside]
        self.sums += np.bincount(idx, weights=kept, minlength=self.sums.size)
        self.counts += np.bincount(idx, minlength=self.sums.size)

    def add_buckets(self, other: Buckets) -> None:
        lo = max(self.first, other.first)
        hi = min(self.first + self.sums.size, other.first + other.sums.size)
        if hi <= lo:
            return
        mine = slice(lo - self.first, hi - self.first)
        theirs = slice(lo - other.first, hi - other.first)
        self.sums[mine] += other.sums[theirs]
        self.counts[mine] += other.counts[theirs]

    def move_to(self, first: int) -> None:
        moved = Buckets.empty(self.width, first, self.sums.size)
        moved.add_buckets(self)
        self.first, self.sums, self.counts = first, moved.sums, moved.counts


@dataclass
class Window:
    """One target's window: `size` buckets of `width` seconds up to the one nearest the
    read's time, and the raw samples after `sealed` on the `step` grid (slot i of `tail`
    at `sealed + (i + 1) * step`)."""

    step: float
    width: float
    size: int
    buckets: Buckets | None = None
    sealed: float = -math.inf
    tail: FloatArray = field(default_factory=lambda: np.empty(0))
    fetched_until: float | None = None

    def advance(self, now: float) -> None:
        """Move the window to end at the bucket end nearest `now` (where the forecaster's
        newest bucket ends); raw samples older than the window are dropped."""
        first = round(now / self.width) - self.size + 1
        if self.buckets is None:
            self.buckets = Buckets.empty(self.width, first, self.size)
        self.buckets.move_to(first)
        start = (first - 1) * self.width
        if self.sealed < start:
            drop = round((start - self.sealed) / self.step) if math.isfinite(self.sealed) else 0
            self.tail = self.tail[drop:].copy() if drop < self.tail.size else np.empty(0)
            self.sealed = start

    def write(self, times: FloatArray, values: FloatArray) -> None:
        """A read's samples into their slots of the raw tail (one read again replaces
        itself); those at or before `sealed` are in the buckets already."""
        idx = np.rint((times - self.sealed) / self.step).astype(np.int64) - 1
        ok = idx >= 0
        if not ok.any():
            return
        idx, values = idx[ok], values[ok]
        need = int(idx.max()) + 1
        if need > self.tail.size:
            grown = np.full(need, np.nan)
            grown[: self.tail.size] = self.tail
            self.tail = grown
        self.tail[idx] = values

    def seal(self, until: float) -> None:
        """The raw samples up to the bucket end at or before `until` into their buckets."""
        boundary = math.floor(until / self.width + 1e-9) * self.width
        if self.buckets is None or boundary <= self.sealed:
            return
        n = min(self.tail.size, round((boundary - self.sealed) / self.step))
        self.buckets.add(self._tail_times()[:n], self.tail[:n])
        self.tail = self.tail[n:].copy()
        self.sealed = boundary

    def _tail_times(self) -> FloatArray:
        times: FloatArray = self.sealed + self.step * np.arange(1, self.tail.size + 1.0)
        return times

    def empty(self) -> bool:
        return not (
            (self.buckets is not None and self.buckets.counts.any()) or np.isfinite(self.tail).any()
        )

    def series(self) -> Series:
        """The bucket means (NaN where a bucket holds no finite sample)."""
        assert self.buckets is not None
        b = self.buckets
        whole = Buckets(self.width, b.first, b.sums.copy(), b.counts.copy())
        whole.add(self._tail_times(), self.tail)
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(whole.counts > 0, whole.sums / whole.counts, np.nan)
        return Series(start=b.first * self.width, step=self.width, values=means)
