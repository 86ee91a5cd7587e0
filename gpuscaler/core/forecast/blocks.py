"""Kept per-series arrays that are rows of one batch array (issue 20).

Each series' kept scoring holds its own arrays (recent errors, sorted errors, peak errors,
smoothing weights), yet a batch reads and writes them for all its series at once: stacked
every tick into one (n, ...) array, then split into rows again. `as_rows` hands out the
rows of a batch's array and remembers them; `stacked` of exactly those rows, in order,
returns that array itself (no copy), of anything else `np.stack` of them. Identity of the
row objects is checked (weak references: nothing is kept alive), so the result is the
same values either way: only the copy is saved.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Sequence

import numpy as np

from gpuscaler.core.model import FloatArray

_KEEP = 256
"""Blocks remembered at most (the oldest forgotten first: then stacked again)."""

_target = weakref.ref.__call__

_Entry = tuple[weakref.ref[FloatArray], bool, tuple[weakref.ref[FloatArray], ...]]
_blocks: dict[int, _Entry] = {}


def as_rows(block: FloatArray, swapped: bool = False) -> list[FloatArray]:
    """The rows of `block` (n, ...), made read-only; `swapped`: each row transposed
    (`block` is (n, b, a), the rows (a, b)). Remembered only when `block` owns its memory
    (its rows keep it alive then)."""
    block.flags.writeable = False
    out = list(block.swapaxes(1, 2) if swapped else block)  # the views made in C
    if out and block.base is None:
        key = id(out[0])
        # the entry goes when its block does (and the oldest beyond _KEEP, if ever)
        forget = _forget(key)
        _blocks[key] = (weakref.ref(block, forget), swapped, tuple(map(weakref.ref, out)))
        while len(_blocks) > _KEEP:
            _blocks.pop(next(iter(_blocks), -1), None)
    return out


def _forget(key: int) -> Callable[[object], None]:
    def forget(_: object) -> None:
        _blocks.pop(key, None)

    return forget


def stacked(rows: Sequence[FloatArray]) -> FloatArray:
    """`np.stack(rows)` in values: the block they were handed out from when they are all
    its rows in order (a read-only view, no copy), else their stack."""
    found = block_of(rows)
    return found if found is not None else np.stack(rows)


def block_of(rows: Sequence[FloatArray]) -> FloatArray | None:
    """The block `rows` (not empty) were handed out from when they are all its rows in
    order (as `stacked` gives it: rows of one shape), else None."""
    entry = _blocks.get(id(rows[0]))
    if entry is not None:
        block, swapped, refs = entry[0](), entry[1], entry[2]
        if (
            block is not None
            and len(refs) == len(rows)
            and all(map(operator.is_, map(_target, refs), rows))
        ):
            return block.swapaxes(1, 2) if swapped else block
    return None
