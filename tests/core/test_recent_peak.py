"""The recent peak of a workload's load: the highest fit_step bucket mean since the
previous tick, what the replica floor sizes for when it is reactive."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from gpuscaler.core.model import Series
from gpuscaler.core.snapshot import bucket_peaks

NOW = 1_000.0
STEP = 0.5


def series(values: list[float] | np.ndarray, end: float = NOW - STEP) -> Series:
    v = np.asarray(values, dtype=np.float64)
    return Series(start=end - STEP * (len(v) - 1), step=STEP, values=v)


def level(n: int, value: float = 100.0) -> np.ndarray:
    return np.full(n, value)


@dataclass
class Row:
    values: np.ndarray | None
    expect: float | None


def with_bucket(at_from_end: int, value: float) -> np.ndarray:
    """120 s at 100 with the 10 s bucket `at_from_end` buckets before the newest at `value`."""
    v = level(240)
    end = 240 - 20 * at_from_end
    v[end - 20 : end] = value
    return v


def spike() -> np.ndarray:
    v = level(240)
    v[-5] = 1000.0
    return v


def gappy() -> np.ndarray:
    v = with_bucket(1, 300.0)
    v[-40:-30] = np.nan  # half of the 300 bucket missing: the rest still averages 300
    return v


ROWS = {
    "a flat load peaks at its level": Row(level(240), 100.0),
    "the highest bucket of the window wins": Row(with_bucket(1, 300.0), 300.0),
    "the newest bucket counts": Row(with_bucket(0, 250.0), 250.0),
    "the oldest bucket of the window counts": Row(with_bucket(2, 300.0), 300.0),
    "a bucket before the window does not count": Row(with_bucket(3, 300.0), 100.0),
    "one 500 ms spike counts as its share of a 10 s bucket": Row(spike(), 145.0),
    "gaps are left out of a bucket's mean": Row(gappy(), 300.0),
    "no finite sample: unknown": Row(np.full(240, np.nan), None),
    "less than one bucket of samples: unknown": Row(level(10), None),
    "no series: unknown": Row(None, None),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=list(ROWS))
def test_recent_peak(row: Row) -> None:
    s = None if row.values is None else series(row.values)
    [got] = bucket_peaks([s], NOW, 30.0, 10.0)
    if row.expect is None:
        assert got is None
    else:
        assert got == pytest.approx(row.expect)


@pytest.mark.parametrize("lag", [STEP, 0.0], ids=["newest one step before now", "newest at now"])
def test_every_bucket_is_seen_by_one_tick_or_another(lag: float) -> None:
    """Ticks 30 s apart, each reading its last 30 s (samples up to `now - lag`): a 10 s
    burst anywhere in 10 minutes is seen by some tick at (nearly) its full height."""
    for at in range(0, 570, 10):
        v = level(1200, 0.0)  # samples at 0, 0.5, ... 599.5 s
        v[2 * at : 2 * at + 20] = 300.0
        seen = 0.0
        for now in range(30, 601, 30):
            visible = v[: min(1200, round((now - lag) / STEP) + 1)]
            [peak] = bucket_peaks([Series(start=0.0, step=STEP, values=visible)], now, 30.0, 10.0)
            seen = max(seen, peak or 0.0)
        assert seen >= 285.0, f"a burst at {at} s was seen at {seen:g} at most"
