"""Issue 20: `_rolled` finds that a batch's rows roll together (the steady lanes) without
a key made row by row. The oracle is that key: one group exactly when every row has the
same shapes and as many errors after, whether the rows are loose arrays, rows of one
block or of one kept window."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscaler.core.forecast import strips
from gpuscaler.core.forecast.blocks import as_rows
from gpuscaler.core.forecast.ensemble import ASSESS_ORIGINS
from gpuscaler.core.forecast.made import scored
from gpuscaler.core.forecast.scored import _one_group
from gpuscaler.core.model import FloatArray, Scored


def _keys(sub: list[Scored], counts: list[int]) -> set[object]:
    """The groups `_rolled` made row by row before."""
    return {
        (s.abs_recent.shape, s.peak_recent.shape, min(s.peak_recent.shape[0] + c, ASSESS_ORIGINS))
        for s, c in zip(sub, counts, strict=True)
    }


def _sub(recent: list[FloatArray], peaks: list[FloatArray]) -> list[Scored]:
    inv = np.ones(3)
    return [
        scored("ensemble", (1.0,), {}, 0, inv, r, 0.0, r, p, 0.0)
        for r, p in zip(recent, peaks, strict=True)
    ]


@pytest.mark.parametrize("seed", range(6))
def test_one_group_is_found_exactly_when_every_rows_key_is_the_same(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, steps = 5, 3
    for _ in range(40):
        depths = rng.choice([ASSESS_ORIGINS - 2, ASSESS_ORIGINS], size=n, p=[0.2, 0.8])
        counts = rng.integers(1, 3, size=n).tolist()
        if rng.random() < 0.5:  # rows of one block, of one window: one shape
            depths[:] = depths[0]
            block = rng.normal(size=(n, steps, int(depths[0])))
            recent = as_rows(block, True)
            if rng.random() < 0.5:
                recent = strips.rolled(recent, 1, rng.normal(size=(n, steps, 1)))
            d = recent[0].shape[0]
            peaks = as_rows(rng.normal(size=(n, d)))
        else:
            recent = [rng.normal(size=(int(d), steps)) for d in depths]
            peaks = [rng.normal(size=int(d)) for d in rng.permutation(depths)]
        sub = _sub(recent, peaks)
        assert _one_group(recent, peaks, counts) == (len(_keys(sub, counts)) == 1)
