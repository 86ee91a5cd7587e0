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

import operator
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gpuscaler.core.forecast.blocks import stacked
from gpuscaler.core.model import FloatArray

SLACK = 64
"""Columns a strip holds beyond its window: a copy every ~40 ticks, not every tick."""
_KEEP = 256
"""Windows remembered at most (the oldest forgotten first: then copied again)."""

_target = weakref.ref.__call__


@dataclass(eq=False)
class _Strip:
    buffer: FloatArray  # (n, steps, columns), written up to `end`
    end: int


_Window = tuple[tuple[weakref.ref[FloatArray], ...], _Strip, int, int]
_windows: dict[int, _Window] = {}


def kept(rows: Sequence[FloatArray]) -> FloatArray:
    """The recent errors (n, steps, depth) of the rows (each (depth, steps)), in order:
    their window when they are one's rows, else their stack."""
    found = _found(rows)
    if found is None:
        return stacked(rows).swapaxes(1, 2)
    strip, start, stop = found
    return strip.buffer[:, :, start:stop]


def rolled(rows: Sequence[FloatArray], old: int, new: FloatArray) -> list[FloatArray]:
    """The rows (each (depth, steps)) without their `old` oldest errors, with `new`
    (n, steps, j) after them: read-only rows (depth - old + j, steps), in order."""
    j = new.shape[2]
    found = _found(rows)
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
    key = id(out[0])
    refs = (weakref.ref(out[0], _forget(key)), *map(weakref.ref, out[1:]))
    _windows[key] = (refs, strip, start, stop)
    while len(_windows) > _KEEP:
        _windows.pop(next(iter(_windows), -1), None)
    return out


def _found(rows: Sequence[FloatArray]) -> tuple[_Strip, int, int] | None:
    """The strip and window whose rows `rows` are, all and in order; None if none."""
    entry = _windows.get(id(rows[0]))
    if entry is None:
        return None
    refs, strip, start, stop = entry
    if len(refs) != len(rows) or not all(map(operator.is_, map(_target, refs), rows)):
        return None
    return strip, start, stop


def _forget(key: int) -> Callable[[object], None]:
    def forget(_: object) -> None:
        _windows.pop(key, None)

    return forget
