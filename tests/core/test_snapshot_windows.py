"""The snapshot's window means of many series on one grid (the pools' stall, issue 20:
only the window's samples stacked) are each series' own, to the last bit."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscaler.core.model import Series
from gpuscaler.core.snapshot import window_mean, window_means


def _rows(rng: np.random.Generator, size: int) -> list[Series | None]:
    """Series on one grid: whole, with gaps in and out of the window, with no finite
    sample in the window's part (newest found before it), with none at all; and a None."""
    values = rng.normal(50.0, 20.0, (9, size))
    values[1, -3] = np.nan
    values[2, ::7] = np.nan
    values[3, -40:] = np.nan  # the window empty, the newest sample before it
    values[4, :] = np.nan
    values[5, -1] = np.inf
    values[6, -1] = np.nan
    values[7, : size - 5] = np.nan
    out: list[Series | None] = [Series(1000.0, 10.0, row) for row in values]
    return [*out[:4], None, *out[4:]]


@pytest.mark.parametrize(
    ("size", "now", "window"),
    [
        (360, 1000.0 + 3600.0, 300.0),
        (360, 1000.0 + 3590.0, 300.0),
        (360, 1000.0 + 3600.0, 7200.0),  # the window longer than the series
        (360, 1000.0 + 9000.0, 300.0),  # the window after the last sample
        (8, 1000.0 + 80.0, 300.0),
        (45, 1000.0 + 450.0, 10.0),
    ],
)
def test_each_series_mean_and_newest_sample_are_those_it_has_alone(
    size: int, now: float, window: float
) -> None:
    series = _rows(np.random.default_rng(size), size)
    got = window_means(series, now, window)
    want = [window_mean(s, now, window) for s in series]
    assert [(repr(m), t) for m, t in got] == [(repr(m), t) for m, t in want]
