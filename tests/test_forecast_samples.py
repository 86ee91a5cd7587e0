"""Each series' last sample time and finite samples, found for a batch of series on one
grid at once (issue 20), are those of each series alone, wherever its gaps are."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscaler.core import forecast
from gpuscaler.core.model import Series

NAN = np.nan


def _alone(s: Series | None) -> tuple[float | None, int]:
    if s is None:
        return None, 0
    return s.last_sample_time(), int(np.isfinite(s.values).sum())


@pytest.mark.parametrize(
    "rows",
    [
        [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]],  # every sample finite
        [[NAN, 2.0, 3.0], [4.0, 5.0, 6.0]],  # a leading gap: every last sample finite
        [[1.0, 2.0, NAN], [4.0, NAN, 6.0]],  # a trailing gap
        [[NAN, NAN, NAN], [4.0, 5.0, 6.0]],  # no sample at all
        [[1.0, np.inf, 3.0], [-np.inf, 5.0, NAN]],  # infinite samples are not samples
    ],
)
def test_series_on_one_grid_get_the_figures_each_gets_alone(rows: list[list[float]]) -> None:
    series = [Series(100.0, 10.0, np.array(r)) for r in rows]
    samples, stacked = forecast._samples(series)
    assert stacked is not None
    assert samples == [_alone(s) for s in series]


def test_a_missing_series_among_others_gets_no_figures() -> None:
    series = [Series(100.0, 10.0, np.array([NAN, 2.0])), None, Series(100.0, 10.0, np.ones(2))]
    samples, _ = forecast._samples(series)
    assert samples == [_alone(s) for s in series]
