"""Kept recent errors rolled on in place of copied (issue 20).

Every tick a batch's kept scorings drop their oldest recent errors and append one or two
new ones a row and step: the whole (rows, steps, ASSESS_ORIGINS) block was copied to do
it. Here each block is a window of a wider buffer (a strip, SLACK columns more): the new
errors are written once after the window, the next window starts `old` later, and only
a full strip is copied (into a new one). A strip's columns are written once: an append
is made only from the newest window of its strip (one tick's rows rolled twice, or in
another grouping, get a new strip), so every window handed out keeps its values. The
rows handed out are read-only views, in order; their values are those of the copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuscaler.core.forecast.blocks import stacked
from gpuscaler.core.forecast.by_identity import ByIdentity
from gpuscaler.core.model import FloatArray

SLACK = 64
"""Columns a strip holds beyond its window: a copy every ~40 ticks, not every tick."""
_KEEP = 256
"""Windows remembered at most (the oldest forgotten first: then copied again)."""


@dataclass(eq=False)
class _Strip:
    buffer: FloatArray  # (n, steps, columns), written up to `end`
    end: int


_windows: ByIdentity[FloatArray, tuple[_Strip, int, int]] = ByIdentity(_KEEP)
"""Each window handed out (its rows, in order): its strip, first and last column."""


def kept(rows: Sequence[FloatArray]) -> FloatArray:
    """The recent errors (n, steps, depth) of the rows (each (depth, steps)), in order:
    their window when they are one's rows, else their stack."""
    found = window_of(rows)
    return found if found is not None else stacked(rows).swapaxes(1, 2)


def window_of(rows: Sequence[FloatArray]) -> FloatArray | None:
    """The window (n, steps, depth) `rows` are, when `rolled` handed them out (rows of one
    shape), else None."""
    found = _windows.get(rows)
    if found is None:
        return None
    strip, start, stop = found
    return strip.buffer[:, :, start:stop]


def rolled(rows: Sequence[FloatArray], old: int, new: FloatArray) -> list[FloatArray]:
    """The rows (each (depth, steps)) without their `old` oldest errors, with `new`
    (n, steps, j) after them: read-only rows (depth - old + j, steps), in order."""
    j = new.shape[2]
    found = _windows.get(rows)
    if found is not None and found[0].end == found[2] and found[2] + j <= found[0].buffer.shape[2]:
        strip, start, stop = found
        strip.buffer[:, :, stop : stop + j] = new
        start, stop = start + old, stop + j
    else:
        before = kept(rows)[:, :, old:]
        stop = before.shape[2] + j
        n, steps = new.shape[:2]
        strip, start = _Strip(np.empty((n, steps, stop + SLACK)), stop), 0
        strip.buffer[:, :, : before.shape[2]] = before
        strip.buffer[:, :, before.shape[2] : stop] = new
    strip.end = stop
    window = strip.buffer[:, :, start:stop].view()
    window.flags.writeable = False
    out = list(window.swapaxes(1, 2))
    _windows.put(out, (strip, start, stop))
    return out
