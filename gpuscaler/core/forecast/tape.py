"""Simple exponential smoothing's levels, for every constant at once (the recursion a
forecast steps through every tick: issue 20).

`ses_last` is the definition; `SesTape` finds the same levels for many ends of one window
in one pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from gpuscaler.core.forecast.engines import last_finite
from gpuscaler.core.model import BoolArray, FloatArray, IntArray

SES_ALPHAS = np.array([0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0])
"""Smoothing constants of simple exponential smoothing, searched per series."""


FILL_COLUMNS = 32
"""Gaps in at most this many columns are filled a column at a time (a window's usual gaps:
its newest bucket, still open, and a few others, in every row), more by a gather."""


def forward_fill(a: FloatArray) -> FloatArray:
    """Each gap takes the last finite value before it (the first finite one at the start).
    Only the columns with a gap are filled, each from the one before it, already filled
    (issue 20: the gather over every point cost as much as a tick's smoothing recursion;
    many gapped columns are gathered as before, in the rows with a gap); a new array."""
    finite = np.isfinite(a)
    out: FloatArray = a.copy()
    if not a.size:
        return out
    cols = np.flatnonzero(~finite.all(axis=0))
    if cols.size > FILL_COLUMNS:
        gappy = np.flatnonzero(~finite.all(axis=1))
        out[gappy] = _filled(a[gappy], finite[gappy])
        return out
    for j in cols.tolist():
        if j:
            out[:, j] = np.where(finite[:, j], out[:, j], out[:, j - 1])
    lead = np.flatnonzero(~finite[:, 0])  # only their leading points can be left unfilled
    if lead.size:
        rows = out[lead]
        out[lead] = np.where(np.isfinite(rows), rows, last_finite(a[lead, ::-1])[:, None])
    return out


def _filled(a: FloatArray, finite: BoolArray) -> FloatArray:
    """`forward_fill` of rows (n, t) whose finite points are `finite`, every row gathered."""
    idx = np.where(finite, np.arange(a.shape[1])[None, :], 0)
    np.maximum.accumulate(idx, axis=1, out=idx)
    out: FloatArray = a[np.arange(a.shape[0])[:, None], idx]
    return np.where(np.isfinite(out), out, last_finite(a[:, ::-1])[:, None])


def ses_last(hist: FloatArray) -> FloatArray:
    """The smoothed levels at the newest point (alphas, n): `ses_levels(hist)[:, :, -1]`
    by the same recursion, without keeping the levels at every point."""
    filled = np.ascontiguousarray(forward_fill(hist).T)  # (t, n)
    a = SES_ALPHAS[:, None]
    keep = 1.0 - a
    out = np.repeat(filled[0][None, :], a.shape[0], axis=0)
    for j in range(1, filled.shape[0]):
        np.multiply(out, keep, out=out)
        out += a * filled[j][None, :]
    return out


def ses_at(hist: FloatArray, ends: IntArray) -> FloatArray:
    """`ses_levels(hist)[:, :, ends]` (alphas, n, len(ends)), `ends` increasing, by the same
    recursion in one pass that keeps only the levels at `ends` (issue 20: an assessment
    kept every point's, (t, alphas, n), to read ~73 of them), C-contiguous."""
    flat = _Flat(hist)
    level, at = flat.first(), 0
    out = np.empty((ends.shape[0], level.shape[0]))
    for i, end in enumerate(ends.tolist()):
        at = flat.step(level, at, end)
        out[i] = level
    if at == hist.shape[1] - 1 and hist.dtype == np.float64:  # kept for the tick's tape
        _LAST[:] = [(hist.copy(), level.copy())]
    shape = (ends.shape[0], SES_ALPHAS.shape[0], hist.shape[0])
    return np.ascontiguousarray(out.reshape(shape).transpose(1, 2, 0))


_LAST: list[tuple[FloatArray, FloatArray]] = []
"""The last window `ses_at` read to its last point, and its levels there (alphas * n)."""


def _kept_last(hist: FloatArray) -> FloatArray | None:
    """The levels after `hist`'s last point when `ses_at` last read a window of the same
    bits to its end (issue 20: a refit tick's assessment and its tape both made them, in a
    pass over the whole window each); None otherwise."""
    kept = _LAST[0] if _LAST else None
    if kept is None or kept[0].shape != hist.shape or hist.dtype != np.float64:
        return None
    if not np.array_equal(kept[0].view(np.int64), hist.view(np.int64)):
        return None
    return kept[1].copy()


CHUNK_BYTES = 1 << 18
"""The products of a chunk of points are made together, at most ~256 KB of them (at least
16 points): they stay in the core's cache until the recursion reads them (issue 20: all
of a window's at once, 5 MB at 160 rows, cost a third more at that size)."""


class _Flat:
    """A window forward-filled (t, n), read as the products `ses_last` makes one step at a
    time (each point times every constant), made a chunk of points at a time, each step's
    levels one flat contiguous (alphas * n) vector with the constants' complements repeated
    to it: 2 numpy calls a step that do not broadcast, the same products and sums element
    by element (issue 20: about half the time of (alphas, n) with (alphas, 1))."""

    def __init__(self, hist: FloatArray):
        self.filled = np.ascontiguousarray(forward_fill(hist).T)  # (t, n)
        n = hist.shape[0]
        self.keep: FloatArray = np.repeat(1.0 - SES_ALPHAS, n)
        self.chunk = max(16, CHUNK_BYTES // (8 * SES_ALPHAS.shape[0] * max(n, 1)))
        self._scaled: FloatArray = np.empty((0, 0))
        self._buffer: FloatArray | None = None
        self._from = -1

    def first(self) -> FloatArray:
        """The levels after the first point: that point for every constant."""
        out: FloatArray = np.tile(self.filled[0], SES_ALPHAS.shape[0])
        return out

    def step(self, level: FloatArray, at: int, end: int) -> int:
        """`level` (after point `at`) stepped in place to after point `end`; returns `end`."""
        multiply, add, keep, j = np.multiply, np.add, self.keep, at + 1
        while j <= end:
            scaled, lo = self._products(j)
            for point in scaled[j - lo : end + 1 - lo]:  # out given by position: fewer
                multiply(level, keep, level)  # keyword parses a step (issue 20)
                add(level, point, level)
            j = lo + scaled.shape[0]
        return end

    def _products(self, j: int) -> tuple[FloatArray, int]:
        """The chunk of products holding point `j` (chunk-aligned), and its first point,
        made in one buffer for every chunk (issue 20: a fresh array a chunk cost the
        products twice their time)."""
        lo = j - j % self.chunk
        if lo != self._from:
            points = self.filled[lo : lo + self.chunk, None, :]
            if self._buffer is None:
                self._buffer = np.empty((self.chunk, SES_ALPHAS.shape[0], points.shape[2]))
            part = np.multiply(SES_ALPHAS[None, :, None], points, out=self._buffer[: len(points)])
            self._scaled, self._from = part.reshape(part.shape[0], -1), lo
        return self._scaled, lo


class SesTape:
    """`ses_last(hist[:, : end + 1])` for the ends a tick asks for (the origins completed
    since the kept scorings, then the live origin), from one pass over `hist` (n, t) where
    the ends come in increasing order (issue 20: one pass per end cost a tick two or three
    passes of ~360 steps): the recursion carries on from the last end asked for, with the
    same operations as `ses_last`, so each end's levels are bit for bit the same."""

    def __init__(self, hist: FloatArray):
        self.hist = hist
        self._flat: _Flat | None = None
        self._level: FloatArray | None = None
        self._at = -1
        finite = np.isfinite(hist)
        self._first = np.where(finite.any(axis=1), np.argmax(finite, axis=1), hist.shape[1])

    def at(self, end: int) -> FloatArray:
        """The levels (alphas, n) after the point at index `end`."""
        if self._level is None and end == self.hist.shape[1] - 1:
            self._level, self._at = _kept_last(self.hist), end
        if self._level is None or end < self._at:
            self._level, self._at = self._stepped().first(), 0
        if end != self._at:
            self._at = self._stepped().step(self._level, self._at, end)
        levels = self._level.reshape(SES_ALPHAS.shape[0], self.hist.shape[0]).copy()
        # a row with no finite point up to `end`: forward filling that prefix alone has no
        # value to fill with, so `ses_last` of it is NaN
        levels[:, self._first > end] = np.nan
        return levels

    def _stepped(self) -> _Flat:
        """The window's products, made at the first step."""
        if self._flat is None:
            self._flat = _Flat(self.hist)
        return self._flat

    def many(self, ends: IntArray) -> FloatArray:
        """The levels (len(ends), alphas, n) after each point of `ends`, stepped to in
        increasing order whatever order they come in (issue 20: one pass for all the
        origins a tick scores, where a pass per group of rows restarted from the first
        point whenever a group's origins were older than the previous group's)."""
        order = sorted(set(ends.tolist()))
        found = {end: self.at(end) for end in order}
        return np.stack([found[end] for end in ends.tolist()])

    def rows(self, idx: IntArray) -> TapeRows:
        """The same tape read for the rows `idx` only."""
        return TapeRows(self, idx)


@dataclass(frozen=True, eq=False)
class TapeRows:
    """Some rows of a `SesTape`."""

    tape: SesTape
    idx: IntArray

    def at(self, end: int) -> FloatArray:
        out: FloatArray = self.tape.at(end)[:, self.idx]
        return out

    def many(self, ends: IntArray) -> FloatArray:
        out: FloatArray = self.tape.many(ends)[:, :, self.idx]
        return out


class SmoothingLevels(Protocol):
    """The smoothing levels of some rows at any end (`SesTape`, `TapeRows`)."""

    def at(self, end: int) -> FloatArray: ...

    def many(self, ends: IntArray) -> FloatArray: ...
