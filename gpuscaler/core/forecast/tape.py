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
from gpuscaler.core.model import FloatArray, IntArray

SES_ALPHAS = np.array([0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0])
"""Smoothing constants of simple exponential smoothing, searched per series."""


def forward_fill(a: FloatArray) -> FloatArray:
    """Each gap takes the last finite value before it (the first finite one at the start)."""
    finite = np.isfinite(a)
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


class SesTape:
    """`ses_last(hist[:, : end + 1])` for the ends a tick asks for (the origins completed
    since the kept scorings, then the live origin), from one pass over `hist` (n, t) where
    the ends come in increasing order (issue 20: one pass per end cost a tick two or three
    passes of ~360 steps): the recursion carries on from the last end asked for, with the
    same operations as `ses_last`, so each end's levels are bit for bit the same."""

    def __init__(self, hist: FloatArray):
        self.hist = hist
        self._filled: FloatArray | None = None
        self._scaled: FloatArray = np.empty((0, 0))
        self._keep: FloatArray = np.empty(0)
        self._level: FloatArray | None = None
        self._at = -1
        finite = np.isfinite(hist)
        self._first = np.where(finite.any(axis=1), np.argmax(finite, axis=1), hist.shape[1])

    def at(self, end: int) -> FloatArray:
        """The levels (alphas, n) after the point at index `end`."""
        alphas, n = SES_ALPHAS.shape[0], self.hist.shape[0]
        if self._filled is None:
            self._filled = np.ascontiguousarray(forward_fill(self.hist).T)  # (t, n)
            # each point times every alpha, all at once: the products `ses_last` makes
            # one step at a time (2 numpy calls a step instead of 3); each step's levels
            # one flat contiguous (alphas * n) vector and the constants repeated to it, so
            # a step's two calls do not broadcast (the same products and sums, element by
            # element: issue 20, about half the time of (alphas, n) with (alphas, 1))
            scaled = SES_ALPHAS[None, :, None] * self._filled[:, None, :]  # (t, A, n)
            self._scaled = scaled.reshape(scaled.shape[0], alphas * n)
            self._keep = np.repeat(1.0 - SES_ALPHAS, n)
        filled, scaled, keep = self._filled, self._scaled, self._keep
        if self._level is None or end < self._at:
            self._level = np.tile(filled[0], alphas)
            self._at = 0
        out = self._level
        multiply, add = np.multiply, np.add
        for j in range(self._at + 1, end + 1):
            multiply(out, keep, out=out)
            add(out, scaled[j], out=out)
        self._at = end
        levels = out.reshape(alphas, n).copy()
        # a row with no finite point up to `end`: forward filling that prefix alone has no
        # value to fill with, so `ses_last` of it is NaN
        levels[:, self._first > end] = np.nan
        return levels

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
