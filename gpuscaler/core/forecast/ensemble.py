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

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gpuscaler.core.forecast.engines import Fitted, LeastSquaresArima, last_finite, nanmean_rows
from gpuscaler.core.forecast.reductions import column_sums as column_sums
from gpuscaler.core.forecast.reductions import (
    finite_counts,
    first_axis_sums,
    last_axis_nanmax,
    points_after,
    row_sums,
)
from gpuscaler.core.forecast.tape import SES_ALPHAS as SES_ALPHAS
from gpuscaler.core.forecast.tape import SesTape as SesTape
from gpuscaler.core.forecast.tape import SmoothingLevels as SmoothingLevels
from gpuscaler.core.forecast.tape import TapeRows as TapeRows
from gpuscaler.core.forecast.tape import forward_fill as forward_fill
from gpuscaler.core.forecast.tape import ses_at
from gpuscaler.core.forecast.tape import ses_last as ses_last
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


def smoothing_live(levels: FloatArray, best: IntArray, inv: FloatArray) -> dict[str, FloatArray]:
    """The two smoothing members at one origin from the levels of every constant (A, n):
    the best-fit constant's level, and the levels averaged by `inv` (A, n)."""
    rows = np.arange(levels.shape[1])
    # column_sums of (A, n), as the rows of the transposes: no moveaxis (issue 20)
    avg: FloatArray = row_sums((inv * levels).T) / row_sums(inv.T)
    return {"ses": levels[best, rows], "ses_avg": avg}


def _flat_sq_error(s0: FloatArray, s1: FloatArray, s2: FloatArray, level: FloatArray) -> FloatArray:
    """Mean squared error over origins and steps of flat paths at `level` (..., n, O),
    from the future's per-origin count, sum and sum of squares (n, O); NaN if none."""
    ok = np.isfinite(level) & (s0 > 0)
    sq = np.where(ok, s2 - 2 * level * s1 + level**2 * s0, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        out: FloatArray = row_sums(np.maximum(sq, 0.0)) / row_sums(np.where(ok, s0, 0.0))
    return out


def _stats(resid: FloatArray, scratch: bool = False) -> tuple[FloatArray, FloatArray]:
    """MAE and MSE per row of (n, origins, steps), ignoring NaN (NaN if none); `scratch`:
    `resid` may be overwritten (issue 20: gaps zero-filled in place, C order as np.where
    made them, counts from the gaps: the same sums of the same values, fewer passes)."""
    finite = np.isfinite(resid)
    if resid.flags.c_contiguous:
        r = resid if scratch else resid.copy()
        if finite.all():  # the usual case where the future has no gap
            count = np.full(resid.shape[0], resid.shape[1] * resid.shape[2], dtype=np.intp)
        else:
            np.copyto(r, 0.0, where=np.logical_not(finite))
            count = finite_counts(finite, 1)
    else:
        r = np.where(finite, resid, 0.0)
        count = finite_counts(finite, 1)
    sq = np.einsum("nos,nos->n", r, r)  # one pass, no temporary
    np.abs(r, out=r)
    with np.errstate(invalid="ignore", divide="ignore"):
        mae: FloatArray = r.sum(axis=(1, 2)) / count
        mse: FloatArray = sq / count
    return np.where(count > 0, mae, np.nan), np.where(count > 0, mse, np.nan)


def window_means(hist: FloatArray, ends: IntArray, points: int) -> FloatArray:
    """Mean of the `points` values up to each end (n, len(ends)), ignoring gaps: running
    sums, the sum before a window 0.0 where it starts at the first point (issue 20: the
    same sums and differences, without two padded copies)."""
    if not ends.size:
        return np.empty((hist.shape[0], 0))
    sums, gaps, missing = _running(hist)
    before = ends - points  # the point before each window (none when negative)
    has, at = before >= 0, np.maximum(before, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        out: FloatArray = (sums[:, ends] - np.where(has, sums[:, at], 0.0)) / (
            _counts(gaps, missing, ends) - np.where(has, _counts(gaps, missing, at), 0)
        )
    return out


_RUNNING: list[tuple[tuple[str, tuple[int, ...], bytes], FloatArray, IntArray, IntArray]] = []
"""The last window's `_running` sums, by its bytes."""


def _running(hist: FloatArray) -> tuple[FloatArray, IntArray, IntArray]:
    """Each row's running sum of its finite values (n, t), the columns with a gap and each
    row's running count of gaps there (n, gaps + 1, from 0), kept for the last window
    (issue 20: a tick's refresh and its live paths take means of one window, each from a
    running sum over all of it, and counts from a cumsum of booleans, which cost as much;
    the gaps are a few columns). The same bytes, the same sums."""
    key = (hist.dtype.str, hist.shape, hist.tobytes())
    kept = _RUNNING[0] if _RUNNING else None
    if kept is not None and kept[0] == key:
        return kept[1], kept[2], kept[3]
    finite = np.isfinite(hist)
    gaps: IntArray = np.flatnonzero(~finite.all(axis=0))
    missing = np.zeros((hist.shape[0], gaps.size + 1), dtype=np.intp)
    np.cumsum(~finite[:, gaps], axis=1, out=missing[:, 1:])
    if gaps.size:  # summed in place: a second fresh array of the window's size cost more
        sums: FloatArray = np.where(finite, hist, 0.0)
        np.cumsum(sums, axis=1, out=sums)
    else:
        sums = np.cumsum(hist, axis=1)
    _RUNNING[:] = [(key, sums, gaps, missing)]
    return sums, gaps, missing


def _counts(gaps: IntArray, missing: IntArray, ends: IntArray) -> IntArray:
    """The finite points up to each of `ends` (n, len(ends)): every point but the gaps
    (`missing`: each row's running count of gaps at the columns `gaps`, from 0)."""
    out: IntArray = (ends + 1)[None, :] - missing[:, np.searchsorted(gaps, ends, side="right")]
    return out


def arima_in_window(
    engine: LeastSquaresArima, fitted: Fitted, hist: FloatArray, origins: IntArray, steps: int
) -> FloatArray:
    """ARIMA rolled from every origin of every series at once: (n, origins, steps)."""
    n, o = hist.shape[0], origins.size
    rows, at = np.repeat(np.arange(n), o), np.tile(origins, n)
    out: FloatArray = arima_at(engine, fitted, hist, rows, at, steps).reshape(n, o, steps)
    return out


def arima_at(
    engine: LeastSquaresArima,
    fitted: Fitted,
    hist: FloatArray,
    rows: IntArray,
    origins: IntArray,
    steps: int,
) -> FloatArray:
    """ARIMA rolled from origin `origins[i]` of row `rows[i]`, all at once: (pairs, steps)."""
    p, d = engine.p, engine.d
    # the p + d points up to each origin, differenced: the lags, newest first (issue 20:
    # the same differences as of the whole window, found for these points only)
    points = hist[rows[:, None], origins[:, None] - np.arange(p + d)[None, ::-1]]
    lags = (np.diff(points, n=d, axis=1) if d else points)[:, ::-1]
    part = Fitted(fitted.intercept[rows], fitted.phi[rows], fitted.sigma2[rows])
    if np.isfinite(lags).all():  # the mean difference fills gaps only: none to fill
        zmean = np.zeros(rows.shape[0])
    else:
        zmean = nanmean_rows(np.diff(hist, n=d, axis=1) if d else hist)[rows]
    out: FloatArray = engine.roll(part, lags, hist[rows, origins], zmean, steps)
    return out


def _smoothing(
    hist: FloatArray, origins: IntArray, moments: tuple[FloatArray, FloatArray, FloatArray]
) -> tuple[dict[str, FloatArray], IntArray, FloatArray]:
    """Best-fit smoothing and smoothing averaged over its constants by inverse recent
    squared error: levels at the origins (n, O + 1; the last column is the live origin),
    the best constant's index per series and each constant's inverse error (A, n)."""
    ends = np.append(origins, hist.shape[1] - 1)
    levels = ses_at(hist, ends)  # (A, n, O + 1), row-major
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
    f = np.moveaxis(future, 2, 0).copy()  # (steps, n, O), a new array: summed by step
    finite = np.isfinite(f)
    np.copyto(f, 0.0, where=np.logical_not(finite))
    s0, s1 = finite.sum(axis=0).astype(float), first_axis_sums(f)
    moments = (s0, s1, first_axis_sums(np.multiply(f, f, out=f)))
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
    future = points_after(hist, origins, steps)  # (n, O, steps), row-major
    levels, best, inv = _flat_members(hist, origins, future)
    in_window = {k: v[:, :-1, None] for k, v in levels.items()}  # (n, O, 1): flat paths
    live = {k: np.repeat(v[:, -1:], steps, axis=1) for k, v in levels.items()}
    ok = arima_ok[:, None, None]
    in_window["arima"] = arima_in_window(engine, fitted, hist, origins, steps)  # a new array
    np.copyto(in_window["arima"], np.nan, where=np.logical_not(ok))
    live["arima"] = np.where(arima_ok[:, None], arima_live, np.nan)
    errors: dict[str, FloatArray] = {}
    mse: dict[str, FloatArray] = {}
    residuals, peak_errors = {}, {}
    for name, path in in_window.items():
        resid = future - path
        errors[name], mse[name] = _stats(resid, scratch=name not in SELECTABLE)
        if name in SELECTABLE:  # the last value's: kept as found here (issue 20: twice)
            residuals[name] = resid
    raw = raw_weights(mse, _optimism(engine, hist, origins.size), _tiny(hist))
    weights = normalized(raw, live)
    in_window["ensemble"] = combine(weights, in_window)
    live["ensemble"] = combine(weights, live)
    residuals["ensemble"] = future - in_window["ensemble"]
    errors["ensemble"] = _stats(residuals["ensemble"])[0]
    top = last_axis_nanmax(future)  # once for both candidates
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: NaN, unwarned as before
        for name in SELECTABLE:
            peak_errors[name] = top - last_axis_nanmax(in_window[name])
    residuals = {name: residuals[name] for name in SELECTABLE}
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
    (all 0 where no member is usable). Issue 20: the members' weights as rows of one
    (members, n) array, each step once for all of them (the same operations on each)."""
    paths = [live[k] for k in MEMBERS]  # a flat one's rows (n, 1): its column, no reduction
    usable = [np.isfinite(p[:, 0]) if p.shape[1] == 1 else np.isfinite(p).all(1) for p in paths]
    kept = _toward_arima(np.where(usable, [raw[k] for k in MEMBERS], 0.0))
    total = 0 + kept[0]  # summed in MEMBERS' order, as `sum` of the rows
    for row in kept[1:]:
        total = total + row
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(total > 0, kept / total, 0.0)
    return dict(zip(MEMBERS, out, strict=True))


_OTHERS = slice(1, None)
"""The members after ARIMA (MEMBERS[0]): their rows as a view, not a fancy index's copy."""


def _toward_arima(kept: FloatArray) -> FloatArray:
    """`kept` weights (members, n) with every other member's scaled by how clearly it
    beats ARIMA: 0 while its corrected recent squared error is at or above ARIMA's,
    rising linearly to its full weight once ARIMA's is ARIMA_MARGIN above its. Unchanged
    where ARIMA has no weight (dropped, or no live path): the others carry the forecast
    as before."""
    arima = kept[MEMBERS.index("arima")]
    has = arima > 0
    others = kept[_OTHERS]
    with np.errstate(invalid="ignore", divide="ignore"):
        lead = others / np.where(has, arima, 1.0) - 1.0  # ARIMA's error / its, - 1
    gate = np.clip(lead / ARIMA_MARGIN, 0.0, 1.0)
    out = kept.copy()
    out[_OTHERS] = np.where(has, others * gate, others)
    return out


def combine(weights: Mapping[str, FloatArray], paths: Mapping[str, FloatArray]) -> FloatArray:
    """The weighted mean of the members' paths, over the members with a finite value at
    each point (NaN where none has one). The paths may be of shapes that broadcast (a
    flat member (n, ..., 1) beside full ones): the mean has their common shape.

    Issue 20: a member's weight is taken at its path's shape only where the path has a
    gap (else its row weight: constant along the path), so the weights' sum is found at
    the shape the weights vary in; a member's part is its weighted path where every
    weight counts. The same sums, in the same order, of the same values at every point."""
    shape = np.broadcast(*(paths[name] for name in MEMBERS)).shape  # in C: no shape walk
    parts, used = [], []
    for name in MEMBERS:
        path = paths[name]
        w = weights[name].reshape((-1,) + (1,) * (path.ndim - 1))
        finite = np.isfinite(path)
        if not finite.all():
            w = np.where(finite, w, 0.0)
        part = w * path
        parts.append(part if (w > 0).all() else np.where(w > 0, part, 0.0))
        used.append(w)
    first = parts[0]
    if first.shape == shape:  # 0.0 + the first part, in place
        total: FloatArray = np.add(first, 0.0, out=first)
    else:
        total = np.zeros(shape)
        total += first
    for part in parts[1:]:
        total += part
    wsum = np.zeros(np.broadcast(*used).shape)
    for w in used:
        wsum += w
    with np.errstate(invalid="ignore", divide="ignore"):
        np.divide(total, wsum, out=total)
    if not (wsum > 0).all():
        np.copyto(total, np.nan, where=np.logical_not(wsum > 0))
    return total


def choose_method(errors: Mapping[str, float]) -> str:
    """The ensemble, unless the last value's recent error is more than FALLBACK_MARGIN
    lower (or the ensemble has no error to show)."""
    ens, last = errors.get("ensemble", np.nan), errors["last_value"]
    if not np.isfinite(ens) or last < ens * (1 - FALLBACK_MARGIN):
        return "last_value"
    return "ensemble"
