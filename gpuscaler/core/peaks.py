"""The highest value of each window of tick records: the demand reactive sizing sizes for
(the highest of its stabilization window), what a lead time then needed, a burst's
overflow, the observed peak the floor sizes for."""

from __future__ import annotations

import numpy as np

from gpuscaler.core.model import FloatArray, IntArray


def window_max(values: FloatArray, start: IntArray, stop: IntArray) -> FloatArray:
    """The maximum of each row of `values` (rows, records) over each window of records
    [start[i], stop[i]) (the same windows for every row): (rows, windows), -inf for an
    empty window, NaN kept."""
    rows, count = values.shape[0], start.size
    if not count:
        return np.full((rows, 0), -np.inf)
    # One reduction over every row: the windows' bounds interleaved, each window the
    # maximum from its start to its stop (a column of -inf past the last record, so that a
    # window may end there); every other result is between two windows, dropped.
    padded = np.concatenate((values, np.full((rows, 1), -np.inf)), axis=1)
    bounds = np.stack((start, stop), axis=1).ravel()
    found: FloatArray = np.maximum.reduceat(padded, bounds, axis=1)[:, ::2]
    return np.where(stop > start, found, -np.inf)
