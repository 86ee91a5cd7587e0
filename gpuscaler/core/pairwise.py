"""numpy's sums of zero-padded rows, taken from their few nonzero places only.

The skill's level (gpuscaler.core.skill) sums each origin's window as a row as long as
the records, holding the window's values in their own places and zeros elsewhere, so
that it rounds as it always did. numpy sums such a row pairwise (numpy
`numpy/_core/src/umath/loops_utils.h.src`, `pairwise_sum`; a reduction starts from add's
identity 0.0): a row of more than 128 values is split in two at a multiple of 8 near its
middle and the halves' sums added; a block of at most 128 is summed in 8 interleaved
lanes (lane j: its places j, j + 8, ... in order), combined as
((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), and its last n % 8 values are then
added one by one (a block under 8: all of them, one by one, from 0.0).

`padded_sums` makes the same additions in the same order, less those of a padding zero:
x + 0.0 is x, but for x = -0.0, which it makes 0.0; a zero's sign changes no sum but a
zero one, and the reduction's starting 0.0 makes that 0.0 in both. So the sums are the
same to the last bit, for the cost of the window's values instead of the row's length.
`window_means_rows` takes the skill's level over rows with them (rows with a value not
finite: their padded rows summed, as numpy sums them).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from gpuscaler.core.model import FloatArray, IntArray

BLOCK = 128
"""numpy's PW_BLOCKSIZE: blocks up to this long are summed in 8 lanes."""


def _half(n: int) -> int:
    """Where numpy splits a row of n > BLOCK values: near the middle, a multiple of 8."""
    half = n // 2
    return half - half % 8


def _blocks(n: int, start: int = 0) -> list[tuple[int, int]]:
    """The blocks (start, length) numpy's pairwise sum of n values is made of, in order."""
    if n <= BLOCK:
        return [(start, n)]
    half = _half(n)
    return _blocks(half, start) + _blocks(n - half, start + half)


def _joined(sums: FloatArray, n: int, first: int = 0) -> tuple[FloatArray, int]:
    """The blocks' sums (axis 1, from `first`) added up as numpy's halves are; the next
    block's index."""
    if n <= BLOCK:
        return sums[:, first], first + 1
    half = _half(n)
    left, nxt = _joined(sums, half, first)
    right, nxt = _joined(sums, n - half, nxt)
    joined: FloatArray = left + right
    return joined, nxt


def _ranks(keys: IntArray) -> IntArray:
    """Each entry's count of earlier entries with its key (entries in their order)."""
    order = np.argsort(keys, kind="stable")
    ranked = keys[order]
    first = np.flatnonzero(np.r_[True, ranked[1:] != ranked[:-1]])
    counts = np.diff(np.r_[first, ranked.size])
    ranks = np.empty(keys.size, dtype=np.intp)
    ranks[order] = np.arange(ranked.size) - np.repeat(first, counts)
    return ranks


Layout = tuple[IntArray, IntArray, IntArray]
"""Where a window set's values go (`layout`)."""


def padded_sums(
    v: FloatArray, windows: IntArray, places: IntArray, count: int, kept: Layout | None = None
) -> FloatArray:
    """For each row of `v` (rows, n) and each of `count` windows: the sum numpy takes
    (`.sum(axis=-1)`) of a row of n zeros holding v[:, p] at each place p of the window,
    where entry e puts place `places[e]` in window `windows[e]` (a place at most once a
    window). Only the (window, block) pairs with a value are summed, every row at once
    (the rows on the last axis): each lane's values gathered in order, a place past the
    row's end standing for a zero. `kept`: the entries' `layout`, when the caller keeps
    it (`window_means_rows`: one for each window set, `_places`), else made here."""
    rows, n = v.shape
    blocks = _blocks(n)
    lanes, tails, pairs = layout(n, windows, places) if kept is None else kept
    by_place = np.zeros((n + 1, rows))  # place n: the zero of a missing value
    by_place[:n] = v.T
    r = _lanes(by_place, lanes)
    summed = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    for tail in tails:
        summed += np.take(by_place, tail, axis=0)
    sums = np.zeros((count * len(blocks), rows))
    sums[pairs] = summed
    total, _ = _joined(sums.reshape(count, len(blocks), rows), n)
    found: FloatArray = np.ascontiguousarray((0.0 + total).T)
    return found


def _lanes(by_place: FloatArray, places: IntArray) -> FloatArray:
    """The lanes' sums (8, pairs, rows): each lane's values at each rank, in order."""
    found: FloatArray = np.take(by_place, places[0], axis=0)
    for more in places[1:]:
        found += np.take(by_place, more, axis=0)
    return found


def layout(n: int, windows: IntArray, places: IntArray) -> Layout:
    """`padded_sums`' layout of the entries (`windows`, `places`) of rows of n values
    (`_layout`), read-only."""
    found = _layout(n, windows.astype(np.intp), places.astype(np.intp))
    for part in found:
        part.setflags(write=False)
    return found


def _layout(n: int, windows: IntArray, places: IntArray) -> tuple[IntArray, IntArray, IntArray]:
    """Where the values go: `lanes` (ranks, 8, pairs), the places that each (window,
    block) pair's lane adds in order (a lane's k-th value at rank k), n where it has
    none; `tails` (ranks, pairs), the places past a block's lanes added one by one
    after them; `pairs`, each pair's window x blocks + block."""
    blocks = _blocks(n)
    sizes = [size for _, size in blocks]
    block = np.repeat(np.arange(len(blocks)), sizes)
    offset = np.arange(n) - np.repeat([start for start, _ in blocks], sizes)
    lanes_end = np.repeat([size - size % 8 if size >= 8 else 0 for size in sizes], sizes)
    order = np.lexsort((places, windows))  # each window's places in row order
    win, place = windows[order], places[order]
    pairs, slot = np.unique(win * len(blocks) + block[place], return_inverse=True)
    q = offset[place]
    laned = q < lanes_end[place]
    key = slot[laned] * 8 + q[laned] % 8
    ranks = _ranks(key)
    lanes = np.full((int(ranks.max(initial=-1)) + 1, 8 * pairs.size), n, dtype=np.intp)
    lanes[ranks, key] = place[laned]
    rest = ~laned
    tail_ranks = _ranks(slot[rest])
    tails = np.full((int(tail_ranks.max(initial=-1)) + 1, pairs.size), n, dtype=np.intp)
    tails[tail_ranks, slot[rest]] = place[rest]
    # lanes[k] as (8, pairs): a lane's places at one rank, lane-major
    by_lane = np.ascontiguousarray(lanes.reshape(-1, pairs.size, 8).transpose(0, 2, 1))
    if not len(by_lane):  # blocks under 8 values: no lanes, all one by one
        by_lane = np.full((1, 8, pairs.size), n, dtype=np.intp)
    return by_lane, tails, pairs


def window_means_rows(
    v: FloatArray, order: IntArray | None, start: IntArray, stop: IntArray
) -> FloatArray:
    """The skill's level (`skill._window_means`) of each row of `v`: the mean of each
    window [start, stop) of the records in time order (`order`: their places; None: their
    own), the sums of each row's windows zero-padded to its full length, as one row alone
    is summed; taken from the windows' values only (`padded_sums`: the same sums) for the
    rows whose values are all finite."""
    lengths = stop - start
    key = (start.astype(np.intp).tobytes(), stop.astype(np.intp).tobytes())
    rows, cols, kept = _places(v.shape[1], *key, _bytes(order))
    finite = np.isfinite(v).all(axis=1)
    if finite.all():
        sums = padded_sums(v, rows, cols, start.size, kept)
    else:
        sums = np.empty((len(v), start.size))
        some, others = np.flatnonzero(finite), np.flatnonzero(~finite)
        if some.size:
            sums[some] = padded_sums(v[some], rows, cols, start.size, kept)
        sums[others] = _padded_sums(v[others], rows, cols, start.size)
    means: FloatArray = sums / lengths
    return means


def _bytes(order: IntArray | None) -> bytes | None:
    return None if order is None else order.astype(np.intp).tobytes()


@lru_cache(maxsize=16)
def _places(
    n: int, start: bytes, stop: bytes, order: bytes | None
) -> tuple[IntArray, IntArray, Layout]:
    """Each window's entries (window, place), in the windows' order and each window's
    records in time order (`order`: the records' places in time order, None: their own),
    and their sums' layout (`layout`), for the windows [start, stop) of n records:
    kept for the last window sets, a tick's being most often the last tick's. Read-only."""
    first, last = np.frombuffer(start, dtype=np.intp), np.frombuffer(stop, dtype=np.intp)
    lengths = last - first
    rows = np.repeat(np.arange(first.size), lengths)
    at = np.arange(rows.size) + np.repeat(first - (np.cumsum(lengths) - lengths), lengths)
    cols = at if order is None else np.frombuffer(order, dtype=np.intp)[at]
    for part in (rows, cols):
        part.setflags(write=False)
    return rows, cols, layout(n, rows, cols)


def _padded_sums(v: FloatArray, rows: IntArray, cols: IntArray, count: int) -> FloatArray:
    """numpy's sums of the zero-padded rows themselves (for values not finite: NaN's
    bits may differ from `padded_sums`'), a few rows at a time, so that the padded rows
    stay in the cache."""
    step = max(1, _LEVEL_FLOATS // (count * v.shape[1]))
    filled = np.zeros((min(step, len(v)), count, v.shape[1]))
    sums = np.empty((len(v), count))
    for first in range(0, len(v), step):
        part = v[first : first + step]
        filled[: len(part), rows, cols] = part[:, cols]  # the same places each time
        sums[first : first + step] = filled[: len(part)].sum(axis=2)
    return sums


_LEVEL_FLOATS = 524_288
"""Floats of the zero-padded level rows summed at once (4 MB: in the L3 cache; measured
on 100 rows x 126 origins x 250 records: 1 MB 3.5-4.3 ms a tick, 2 MB 2.4-3.0, 4 MB
2.4-2.5, 8 MB 2.5-3.8; fewer passes cost less than the L2 they missed)."""
