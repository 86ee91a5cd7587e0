"""The smoothing tape, the window means and the assessment as gpuscaler/core/forecast/
tape.py and ensemble.py made them at 3ecdbd8, before issue 20's rf8 (forward filling only
the rows with a gap, the tape's products a chunk at a time, the assessment's levels only
at its origins, the window means without padded copies, the last value's residuals and
the future's peak found once): the oracle of tests/test_forecast_tape_rows.py and of
tests/scored_reference.py for those parts. Copied as they were (only the imports
changed)."""

from __future__ import annotations

import warnings

import numpy as np

from gpuscaler.core.forecast.engines import Fitted, LeastSquaresArima, last_finite
from gpuscaler.core.forecast.ensemble import (
    LONG_MEAN_POINTS,
    SELECTABLE,
    SES_ALPHAS,
    WINDOW_MEAN_POINTS,
    Assessment,
    _flat_sq_error,
    _optimism,
    _stats,
    _tiny,
    arima_in_window,
    column_sums,
    combine,
    normalized,
    origins_for,
    raw_weights,
)
from gpuscaler.core.forecast.tape import TapeRows
from gpuscaler.core.model import BoolArray, FloatArray, IntArray


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
        return TapeRows(self, idx)  # type: ignore[arg-type]


def ses_levels(hist: FloatArray) -> FloatArray:
    """Smoothed levels (alphas, n, t) for every constant in SES_ALPHAS, level[t] = alpha *
    y[t] + (1 - alpha) * level[t - 1] from level[0] = y[0], gaps forward-filled: one
    multiply-add per point on time-major contiguous arrays (cheap for one series or a
    thousand)."""
    filled = np.ascontiguousarray(forward_fill(hist).T)  # (t, n)
    a = SES_ALPHAS[:, None]
    keep = 1.0 - a
    scaled = a[None, :, :] * filled[:, None, :]  # (t, A, n)
    out = np.empty_like(scaled)
    out[0] = filled[0][None, :]
    for j in range(1, filled.shape[0]):
        np.multiply(out[j - 1], keep, out=out[j])
        out[j] += scaled[j]
    levels: FloatArray = out.transpose(1, 2, 0)
    return levels


def window_means(hist: FloatArray, ends: IntArray, points: int) -> FloatArray:
    """Mean of the `points` values up to each end (n, len(ends)), ignoring gaps."""
    finite = np.isfinite(hist)
    zero = np.zeros((hist.shape[0], 1))
    sums = np.concatenate([zero, np.cumsum(np.where(finite, hist, 0.0), axis=1)], axis=1)
    counts = np.concatenate([zero, np.cumsum(finite, axis=1)], axis=1)
    hi, lo = ends + 1, np.maximum(ends + 1 - points, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        out: FloatArray = (sums[:, hi] - sums[:, lo]) / (counts[:, hi] - counts[:, lo])
    return out


def _smoothing(
    hist: FloatArray, origins: IntArray, moments: tuple[FloatArray, FloatArray, FloatArray]
) -> tuple[dict[str, FloatArray], IntArray, FloatArray]:
    """Best-fit smoothing and smoothing averaged over its constants by inverse recent
    squared error: levels at the origins (n, O + 1; the last column is the live origin),
    the best constant's index per series and each constant's inverse error (A, n)."""
    ends = np.append(origins, hist.shape[1] - 1)
    levels = np.ascontiguousarray(ses_levels(hist)[:, :, ends])  # (A, n, O + 1), row-major
    mse = _flat_sq_error(*moments, levels[:, :, :-1])  # (A, n)
    mse = np.where(np.isfinite(mse), mse, np.inf)
    best: IntArray = np.argmin(mse, axis=0)
    rows = np.arange(hist.shape[0])
    inv: FloatArray = 1.0 / (mse + _tiny(hist)[None, :])
    avg = column_sums(inv[:, :, None] * levels) / column_sums(inv)[:, None]
    return {"ses": levels[best, rows], "ses_avg": avg}, best, inv


def _flat_members(
    hist: FloatArray, origins: IntArray, future: FloatArray
) -> tuple[dict[str, FloatArray], IntArray, FloatArray]:
    """The flat members' levels (n, O + 1): at each origin, then at the live origin."""
    finite = np.isfinite(future)
    f = np.where(finite, future, 0.0)
    moments = (finite.sum(axis=2).astype(float), f.sum(axis=2), (f * f).sum(axis=2))
    levels, best, inv = _smoothing(hist, origins, moments)
    ends = np.append(origins, hist.shape[1] - 1)
    levels["window_mean"] = window_means(hist, ends, WINDOW_MEAN_POINTS)
    levels["window_mean_long"] = window_means(hist, ends, LONG_MEAN_POINTS)
    levels["last_value"] = np.concatenate([hist[:, origins], last_finite(hist)[:, None]], axis=1)
    return levels, best, inv


def assess(
    engine: LeastSquaresArima,
    fitted: Fitted,
    hist: FloatArray,
    steps: int,
    arima_live: FloatArray,
    arima_ok: BoolArray,
) -> Assessment | None:
    """Score every member on the series' recent history and weight them by evidence;
    `arima_live` is the model's path at the live origin, used only where `arima_ok`.

    ARIMA is scored with the coefficients fitted on the whole window (in-sample: its
    error is inflated by the optimism factor rather than refitted at every origin)."""
    t = hist.shape[1]
    origins = origins_for(t, steps, max(engine.p + engine.d + 2, WINDOW_MEAN_POINTS))
    if origins.size < 4:
        return None
    # (n, O, steps), row-major: numpy's fancy index lays the rows out innermost, so sums
    # over a row would run in an order that depends on how many rows there are.
    future = np.ascontiguousarray(hist[:, origins[:, None] + 1 + np.arange(steps)[None, :]])
    levels, best, inv = _flat_members(hist, origins, future)
    in_window = {k: v[:, :-1, None] for k, v in levels.items()}  # (n, O, 1): flat paths
    live = {k: np.repeat(v[:, -1:], steps, axis=1) for k, v in levels.items()}
    ok = arima_ok[:, None, None]
    in_window["arima"] = np.where(ok, arima_in_window(engine, fitted, hist, origins, steps), np.nan)
    live["arima"] = np.where(arima_ok[:, None], arima_live, np.nan)
    errors: dict[str, FloatArray] = {}
    mse: dict[str, FloatArray] = {}
    for name, path in in_window.items():
        errors[name], mse[name] = _stats(future - path)
    raw = raw_weights(mse, _optimism(engine, hist, origins.size), _tiny(hist))
    weights = normalized(raw, live)
    in_window["ensemble"] = combine(weights, in_window)
    live["ensemble"] = combine(weights, live)
    residuals, peak_errors = {}, {}
    for name in SELECTABLE:
        residuals[name] = future - in_window[name]
        errors[name] = _stats(residuals[name])[0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            peak_errors[name] = np.nanmax(future, axis=2) - np.nanmax(in_window[name], axis=2)
    return Assessment(
        live, errors, weights, residuals, peak_errors, SES_ALPHAS[best], raw, best, inv
    )
