"""What a batch's kept scorings hold from their refits, as arrays over its rows (issue 20).

A scoring's method, members' weights, best smoothing constant and every constant's inverse
error are made at a refit and kept, unchanged, by every scoring the refresh rolls on from
it. Every tick read them row by row, twice (the refresh's errors and the live paths): a
list, a tuple and an array a row. `of(scored)` gives them as arrays (rows in the order of
`scored`), found once and remembered for exactly those scorings (identity, weak references:
nothing is kept alive); `carried(scored, rows)` remembers the same arrays for the scorings
a refresh made from them, so a steady tick gathers nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuscaler.core.forecast.blocks import stacked
from gpuscaler.core.forecast.by_identity import ByIdentity
from gpuscaler.core.model import BoolArray, FloatArray, IntArray, Scored

_KEEP = 64
"""Batches remembered at most (the oldest forgotten first: then gathered again)."""


@dataclass(frozen=True, eq=False)
class KeptRows:
    """The refit's fields of n scorings, row r that of the r-th."""

    ensemble: BoolArray  # (n,) the method is "ensemble"
    weights: FloatArray  # (n, members) `Scored.weights`
    best: IntArray  # (n,) `Scored.ses_best`
    inv: FloatArray  # (n, alphas) `Scored.ses_inv`


_remembered: ByIdentity[Scored, KeptRows] = ByIdentity(_KEEP)


def of(scored: Sequence[Scored]) -> KeptRows:
    """The fields of `scored` (not empty) as arrays: remembered ones when they were found
    for exactly these scorings in this order, else gathered (and remembered)."""
    found = _remembered.get(scored)
    return found if found is not None else carried(scored, _gathered(scored))


def carried(scored: Sequence[Scored], rows: KeptRows) -> KeptRows:
    """Remember `rows` as the fields of `scored` (the same refits' fields, in order)."""
    _remembered.put(scored, rows)
    return rows


def _gathered(scored: Sequence[Scored]) -> KeptRows:
    """The fields read row by row (as every tick did before), read-only."""
    out = KeptRows(
        np.array([s.method == "ensemble" for s in scored]),
        np.array([s.weights for s in scored]),
        np.array([s.ses_best for s in scored], dtype=np.int64),
        stacked([s.ses_inv for s in scored]),
    )
    for a in (out.ensemble, out.weights, out.best, out.inv):
        a.flags.writeable = False
    return out
