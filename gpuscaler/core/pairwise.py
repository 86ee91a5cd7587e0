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
"""

from __future__ import annotations

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


def padded_sums(v: FloatArray, windows: IntArray, places: IntArray, count: int) -> FloatArray:
    """For each row of `v` (rows, n) and each of `count` windows: the sum numpy takes
    (`.sum(axis=-1)`) of a row of n zeros holding v[:, p] at each place p of the window,
    where entry e puts place `places[e]` in window `windows[e]` (a place at most once a
    window). Only the (window, block) pairs with a value are summed in lanes, every row
    at once (the rows on the last axis)."""
    rows, n = v.shape
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
    by_place = np.ascontiguousarray(v.T)
    r = np.zeros((8, pairs.size, rows))
    _add_ranked(r, by_place, (q[laned] % 8, slot[laned]), place[laned])
    lanes = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    rest = ~laned
    _add_ranked(lanes, by_place, (slot[rest],), place[rest])
    sums = np.zeros((count * len(blocks), rows))
    sums[pairs] = lanes
    total, _ = _joined(sums.reshape(count, len(blocks), rows), n)
    found: FloatArray = np.ascontiguousarray((0.0 + total).T)
    return found


def _add_ranked(
    acc: FloatArray, by_place: FloatArray, at: tuple[IntArray, ...], place: IntArray
) -> None:
    """acc[*at[e]] += by_place[place[e]] for each entry e in order (`acc`'s last axis and
    `by_place`'s second: the rows): entries at the same place of `acc` one after the
    other (a round of distinct places at a time)."""
    if not place.size:
        return
    flat = np.ravel_multi_index(at, acc.shape[:-1])
    ranks = _ranks(flat)
    target = acc.reshape(-1, acc.shape[-1])
    for k in range(int(ranks.max()) + 1):
        now = ranks == k
        target[flat[now]] += by_place[place[now]]
