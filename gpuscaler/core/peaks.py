"""The highest value of each window of tick records: the demand reactive sizing sizes for
(the highest of its stabilization window), what a lead time then needed, a burst's
overflow, the observed peak the floor sizes for."""

from __future__ import annotations

import numpy as np

from gpuscaler.core.model import FloatArray, IntArray


def window_max(values: FloatArray, start: IntArray, stop: IntArray) -> FloatArray:
    """The maximum of each row of `values` (rows, records) over each window of records
    [start[i], stop[i]) (the same windows for every row): (rows, windows), -inf for an
    empty window, NaN kept.

    A sparse table: level k holds the maxima of the runs of 2**k records, and a window of
    width w is the larger of its first and its last run of 2**floor(log2 w) (they overlap:
    a value taken twice is the same maximum). A few whole-row maxima and two gathers per
    width class, however many windows."""
    out = np.full((values.shape[0], start.size), -np.inf)
    level = np.frexp(stop - start)[1] - 1  # floor(log2(width)); -1 for an empty window
    table = values
    for k in range(int(level.max(initial=-1)) + 1):
        if k:
            half = 1 << (k - 1)
            table = np.maximum(table[:, :-half], table[:, half:])
        at = np.flatnonzero(level == k)
        if at.size:
            out[:, at] = np.maximum(table[:, start[at]], table[:, stop[at] - (1 << k)])
    return out
