"""The ensemble: members scored on each series' own recent history, weighted by evidence.

At in-window origins whose next `steps` points are known, every member forecasts the
horizon path. A member's weight is the inverse of its recent squared error over the full
horizon, inflated by (m + k) / (m - k) when its k parameters were fitted on the m points it
is scored on (in-sample optimism); the other members take weight from ARIMA only when
their error is clearly lower (ARIMA_MARGIN). A member with no usable path (a gap, a
dropped fit) gets weight 0; the others carry the forecast. The last value replaces the ensemble only
when its recent error is FALLBACK_MARGIN lower.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from gpuscaler.core.forecast.engines import Fitted, LeastSquaresArima, last_finite, nanmean_rows
from gpuscaler.core.model import BoolArray, FloatArray, IntArray

ASSESS_ORIGINS = 72
"""In-window origins every member is scored on, at most (36 let noise switch the
fallback on and off)."""
ORIGIN_SPACING = 15
"""Origins are max(1, steps // ORIGIN_SPACING) points apart (2 at a 30-step horizon)."""
WINDOW_MEAN_POINTS = 12
"""The short window mean averages the last 12 buckets (2 min at 10 s)."""
LONG_MEAN_POINTS = 60
"""The long window mean averages the last 60 buckets (10 min at 10 s): scored only."""
SES_ALPHAS = np.array([0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0])
"""Smoothing constants of simple exponential smoothing, searched per series."""
FALLBACK_MARGIN = 0.25
"""The last value replaces the ensemble only when its recent error is 25 % lower: a
smaller lead is within the noise of a few dozen overlapping origins."""
WEIGHT_POWER = 1.0
"""Weights are proportional to the corrected recent squared error to this power (-1)."""
ARIMA_MARGIN = 0.02
"""Another member takes weight only when its corrected recent squared error is below
ARIMA's, its full weight once ARIMA's is 2 % above its (`_toward_arima`). The in-window
evidence ranks alike members against what follows: on the 2023 conversation
ContextTokens series (bench/forecast_quality) ARIMA's MAE relative to the last value is
0.936 in the window and 0.919 ahead, the best-fit smoothing's 0.931 and 0.982; equal
shares there cost 2.0 % against statsmodels' ARIMA(5,1,0), 0.6 % with this margin. Wider
margins cost more elsewhere (mean relative-to-naive over the 8 series 0.8159 at 0.02 and
0.005, 0.8161 at 0.05, 0.8164 at 0.1 and 0.15, 0.8172 at 0.25; 0.8171 without)."""
MEMBERS = ("arima", "ses", "ses_avg", "window_mean")
"""The members that carry weight."""
SCORED_ONLY = ("window_mean_long",)
"""Scored and reported, no weight: with inverse-squared-error weights the long mean got
10-20 % and cost 0.02-0.04 relative-to-naive on the 2023 conversation trace (0.9835
against 0.9457 without it) and 0.01 on the 2024 week at 1 min (bench/forecast_quality)."""
SELECTABLE = ("ensemble", "last_value")


@dataclass(frozen=True, eq=False)
class Assessment:
    """Paths at the live origin and recent errors, per series."""

    paths: dict[str, FloatArray]  # name -> (n, steps): members, "ensemble", "last_value"
    errors: dict[str, FloatArray]  # name -> (n,) in-window MAE over the horizon path
    weights: dict[str, FloatArray]  # member -> (n,), summing to 1 (0 where unusable)
    residuals: dict[str, FloatArray]  # selectable -> (n, origins, steps): actual - path
    peak_errors: dict[str, FloatArray]  # selectable -> (n, origins): actual max - path max
    alpha: FloatArray  # (n,) best-fit smoothing constant
    raw_weights: dict[str, FloatArray]  # member -> (n,): inverse corrected squared error
    ses_best: IntArray  # (n,) index of the best-fit constant in SES_ALPHAS
    ses_inv: FloatArray  # (A, n) inverse recent squared error of each constant


def origins_for(t: int, steps: int, lowest: int) -> IntArray:
    spacing = max(1, steps // ORIGIN_SPACING)
    out: IntArray = np.arange(t - steps - 1, lowest - 1, -spacing)[:ASSESS_ORIGINS][::-1]
    return out


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


class SmoothingLevels(Protocol):
    """The smoothing levels of some rows at any end (`SesTape`, `TapeRows`)."""

    def at(self, end: int) -> FloatArray: ...


def smoothing_live(levels: FloatArray, best: IntArray, inv: FloatArray) -> dict[str, FloatArray]:
    """The two smoothing members at one origin from the levels of every constant (A, n):
    the best-fit constant's level, and the levels averaged by `inv` (A, n)."""
    rows = np.arange(levels.shape[1])
    avg: FloatArray = column_sums(inv * levels) / column_sums(inv)
    return {"ses": levels[best, rows], "ses_avg": avg}


def row_sums(a: FloatArray) -> FloatArray:
    """Sums over the last axis, each row summed contiguously (pairwise) whatever the
    layout numpy gave `a`: the same for a series alone and in a batch (`column_sums`)."""
    out: FloatArray = np.ascontiguousarray(a).sum(axis=-1)
    return out


def column_sums(a: FloatArray) -> FloatArray:
    """Sums over the first axis of (A, n, ...), each column summed as it is alone (numpy
    sums a contiguous run pairwise but adds strided rows one after another, so a plain
    `sum(axis=0)` of one series differs in the last bits from the same series in a
    batch): a series' figures do not depend on the batch it is forecast in (issue 20's
    lockstep replay)."""
    out: FloatArray = np.ascontiguousarray(np.moveaxis(a, 0, -1)).sum(axis=-1)
    return out


def _flat_sq_error(s0: FloatArray, s1: FloatArray, s2: FloatArray, level: FloatArray) -> FloatArray:
    """Mean squared error over origins and steps of flat paths at `level` (..., n, O),
    from the future's per-origin count, sum and sum of squares (n, O); NaN if none."""
    ok = np.isfinite(level) & (s0 > 0)
    sq = np.where(ok, s2 - 2 * level * s1 + level**2 * s0, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        out: FloatArray = row_sums(np.maximum(sq, 0.0)) / row_sums(np.where(ok, s0, 0.0))
    return out


def _stats(resid: FloatArray) -> tuple[FloatArray, FloatArray]:
    """MAE and MSE per row of (n, origins, steps), ignoring NaN (NaN if none)."""
    finite = np.isfinite(resid)
    r = np.where(finite, resid, 0.0)
    count = np.count_nonzero(finite, axis=(1, 2))
    sq = np.einsum("nos,nos->n", r, r)  # one pass, no temporary
    np.abs(r, out=r)
    with np.errstate(invalid="ignore", divide="ignore"):
        mae: FloatArray = r.sum(axis=(1, 2)) / count
        mse: FloatArray = sq / count
    return np.where(count > 0, mae, np.nan), np.where(count > 0, mse, np.nan)


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


def arima_in_window(
    engine: LeastSquaresArima, fitted: Fitted, hist: FloatArray, origins: IntArray, steps: int
) -> FloatArray:
    """ARIMA rolled from every origin of every series at once: (n, origins, steps)."""
    n, o = hist.shape[0], origins.size
    p, d = engine.p, engine.d
    z = np.diff(hist, n=d, axis=1) if d else hist
    lags = z[:, (origins[:, None] - d) - np.arange(p)[None, :]].reshape(n * o, p)
    rep = Fitted(
        intercept=np.repeat(fitted.intercept, o),
        phi=np.repeat(fitted.phi, o, axis=0),
        sigma2=np.repeat(fitted.sigma2, o),
    )
    zmean = np.repeat(nanmean_rows(z), o)
    last_at = hist[:, origins].reshape(-1)
    out: FloatArray = engine.roll(rep, lags, last_at, zmean, steps).reshape(n, o, steps)
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


def _tiny(hist: FloatArray) -> FloatArray:
    """A squared error too small to tell apart from zero, per row (keeps 1/MSE finite)."""
    out: FloatArray = 1e-12 * (1.0 + nanmean_rows(hist * hist))
    return out


def _optimism(engine: LeastSquaresArima, hist: FloatArray, origins: int) -> dict[str, FloatArray]:
    """(m + k) / (m - k) per member: k parameters fitted on the m points scored."""
    n = hist.shape[0]
    k = engine.p + int(engine.const)
    m = np.maximum(np.isfinite(hist).sum(axis=1) - engine.d - engine.p, k + 1).astype(float)
    one = np.ones(n)
    chosen = np.full(n, (origins + 1) / max(origins - 1, 1))
    return {
        "arima": (m + k) / (m - k),
        "ses": chosen,
        "ses_avg": chosen,
        "window_mean": one,
        "window_mean_long": one,
    }


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


ASSESS_CHUNK = 256
"""Series assessed together: bounds the (series, origins, steps) temporaries to ~4.5 MB
each (a thousand series at once held ~470 MB); fewer chunks, fewer per-step calls in the
smoothing and ARIMA recursions."""


def raw_weights(
    mse: Mapping[str, FloatArray], optimism: Mapping[str, FloatArray], tiny: FloatArray
) -> dict[str, FloatArray]:
    """Inverse corrected recent squared error per member; 0 for a member whose error is
    not finite. They change only when the members are scored (at a refit)."""
    raw = {}
    for name in MEMBERS:
        usable = np.isfinite(mse[name])
        corrected = np.where(usable, mse[name], 1.0) * optimism[name] + tiny
        raw[name] = np.where(usable, corrected**-WEIGHT_POWER, 0.0)
    return raw


def normalized(
    raw: Mapping[str, FloatArray], live: Mapping[str, FloatArray]
) -> dict[str, FloatArray]:
    """`raw` weights normalized per series over the members whose live path is finite
    (all 0 where no member is usable)."""
    kept = {k: np.where(np.isfinite(live[k]).all(axis=1), raw[k], 0.0) for k in MEMBERS}
    kept = _toward_arima(kept)
    total = sum(kept.values())
    with np.errstate(invalid="ignore", divide="ignore"):
        return {k: np.where(total > 0, v / total, 0.0) for k, v in kept.items()}


def _toward_arima(kept: Mapping[str, FloatArray]) -> dict[str, FloatArray]:
    """`kept` weights with every other member's scaled by how clearly it beats ARIMA:
    0 while its corrected recent squared error is at or above ARIMA's, rising linearly to
    its full weight once ARIMA's is ARIMA_MARGIN above its. Unchanged where ARIMA has no
    weight (dropped, or no live path): the others carry the forecast as before."""
    arima = kept["arima"]
    has = arima > 0
    out = dict(kept)
    for name in MEMBERS:
        if name == "arima":
            continue
        with np.errstate(invalid="ignore", divide="ignore"):
            lead = kept[name] / np.where(has, arima, 1.0) - 1.0  # ARIMA's error / its, - 1
        gate = np.clip(lead / ARIMA_MARGIN, 0.0, 1.0)
        out[name] = np.where(has, kept[name] * gate, kept[name])
    return out


def combine(weights: Mapping[str, FloatArray], paths: Mapping[str, FloatArray]) -> FloatArray:
    """The weighted mean of the members' paths, over the members with a finite value at
    each point (NaN where none has one)."""
    first = paths[MEMBERS[0]]
    shape = (-1,) + (1,) * (first.ndim - 1)
    total, wsum = np.zeros(first.shape), np.zeros(first.shape)
    for name in MEMBERS:
        path = paths[name]
        w = np.where(np.isfinite(path), weights[name].reshape(shape), 0.0)
        total += np.where(w > 0, w * path, 0.0)
        wsum += w
    with np.errstate(invalid="ignore", divide="ignore"):
        out: FloatArray = np.where(wsum > 0, total / wsum, np.nan)
    return out


def choose_method(errors: Mapping[str, float]) -> str:
    """The ensemble, unless the last value's recent error is more than FALLBACK_MARGIN
    lower (or the ensemble has no error to show)."""
    ens, last = errors.get("ensemble", np.nan), errors["last_value"]
    if not np.isfinite(ens) or last < ens * (1 - FALLBACK_MARGIN):
        return "last_value"
    return "ensemble"
