"""The snapshot's window means (the pools' stall): the mean of each series' finite samples
in (now - window, now] and its newest finite sample's time, series of any grid together."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscaler.core.model import Series
from gpuscaler.core.snapshot import window_means

NOW = 10_000.0
NAN, INF = np.nan, np.inf


@pytest.mark.parametrize(
    ("values", "step", "window", "expected"),
    [
        ([100, 100, 10, NAN, 20], 60.0, 150.0, (15.0, NOW)),  # the last 2.5 min: 10, NaN, 20
        ([NAN, NAN, NAN], 30.0, 300.0, (None, None)),  # only gaps: unknown
        ([5, 7, NAN, NAN], 10.0, 15.0, (None, NOW - 20)),  # nothing in the window, newest before
        ([10, 30, INF], 10.0, 15.0, (30.0, NOW - 10)),  # an infinite sample is no sample
        ([10, 20, 30], 10.0, 7200.0, (20.0, NOW)),  # a window longer than the series
        ([10, 20, 30], 10.0, 10.0, (30.0, NOW)),  # one slot
    ],
)
def test_window_mean_averages_finite_samples_inside_the_window(
    values: list[float], step: float, window: float, expected: tuple[float | None, float | None]
) -> None:
    s = Series(NOW - step * (len(values) - 1), step, np.array(values, dtype=float))
    assert window_means([s], NOW, window) == [expected]


def test_series_of_several_grids_and_none_each_get_their_own_mean() -> None:
    a = Series(NOW - 20, 10.0, np.array([1.0, 2.0, 3.0]))
    b = Series(NOW - 60, 30.0, np.array([4.0, 8.0, NAN]))
    c = Series(NOW - 20, 10.0, np.array([5.0, NAN, 7.0]))
    got = window_means([a, None, b, c], NOW, 45.0)
    assert got == [(2.0, NOW), (None, None), (8.0, NOW - 30), (6.0, NOW)]
