"""The ensemble: members scored on each series' own recent history, weighted by evidence.

At in-window origins whose next `steps` points are known, every member forecasts the
horizon: ARIMA, simple exponential smoothing (best-fit constant and averaged over its
constants) and the short window mean; the long mean and the last value are scored too. A
member's weight is its inverse recent squared error, inflated by (m + k) / (m - k) for k
parameters fitted on the m points scored; other members take weight from ARIMA only when
clearly better (ARIMA_MARGIN). The last value replaces the ensemble only when its recent
error is FALLBACK_MARGIN lower. Scored at a refit (`assess`), rolled on between (`errors_at`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gpuscaler.core.forecast.arima import Arima, Coefficients, last_finite, nanmean_rows
from gpuscaler.core.forecast.members import forward_fill, ses_at, window_means_at
from gpuscaler.core.model import BoolArray, FloatArray, IntArray

ASSESS_ORIGINS = 72
"""In-window origins every member is scored on, at most (fewer let noise switch the
fallback on and off)."""
ORIGIN_SPACING = 15
"""Origins are max(1, steps // ORIGIN_SPACING) points apart (2 at a 30-step horizon)."""
WINDOW_MEAN_POINTS = 12
"""The short window mean averages the last 12 buckets (2 min at 10 s)."""
LONG_MEAN_POINTS = 60
"""The long window mean (10 min at 10 s): scored only, never weighted."""
FALLBACK_MARGIN = 0.25
"""A smaller lead of the last value is within the noise of a few dozen overlapping origins."""
ARIMA_MARGIN = 0.02
"""Another member takes weight only when its corrected recent squared error is below
ARIMA's, its full weight once ARIMA's is 2 % above: in-window evidence ranks alike
members poorly, and ARIMA's lead holds out of the window."""
MEMBERS = ("arima", "ses", "ses_avg", "window_mean")
"""The members that carry weight, in the order of a scoring's `weights`."""


def origins_for(t: int, steps: int, lowest: int) -> IntArray:
    """The in-window origins (indexes, oldest first) whose next `steps` points are in a
    window of `t`: every max(1, steps // ORIGIN_SPACING)-th back from the newest such, at
    most ASSESS_ORIGINS, none before `lowest`."""
    spacing = max(1, steps // ORIGIN_SPACING)
    out: IntArray = np.arange(t - steps - 1, lowest - 1, -spacing)[:ASSESS_ORIGINS][::-1]
    return out


def lowest_origin(arima: Arima) -> int:
    """The first index an origin may have: ARIMA's lags and the short mean's points."""
    return max(arima.p + arima.d + 2, WINDOW_MEAN_POINTS)


@dataclass(frozen=True, eq=False)
class Assessment:
    """What a refit's scoring found, per row (n rows)."""

    errors: dict[str, FloatArray]  # name -> (n,) in-window MAE over the horizon
    raw_weights: FloatArray  # (n, members) inverse corrected squared error
    ses_best: IntArray  # (n,) index of the best-fit constant in SES_ALPHAS
    ses_inv: FloatArray  # (n, alphas) inverse recent squared error of each constant
    live: dict[str, FloatArray]  # "ensemble", "last_value" -> (n, steps) at the newest point
    residuals: dict[str, FloatArray]  # the same -> (n, origins, steps): actual - path
    peak_errors: dict[str, FloatArray]  # the same -> (n, origins): actual max - path max
    newest: int  # index of the newest origin scored


def assess(
    arima: Arima, c: Coefficients, hist: FloatArray, steps: int, live_arima: FloatArray
) -> Assessment | None:
    """Score every member at the window's origins and weight them (None: fewer than 4
    origins). ARIMA is scored with the whole window's coefficients (its optimism corrected
    rather than refitted per origin); `live_arima`: its path at the newest point (n,
    steps), NaN where the fit may not be used."""
    n, t = hist.shape
    origins = origins_for(t, steps, lowest_origin(arima))
    if origins.size < 4:
        return None
    future = hist[:, origins[:, None] + np.arange(1, steps + 1)[None, :]]  # (n, O, steps)
    levels = ses_at(hist, forward_fill(hist), np.append(origins, t - 1))  # (alphas, n, O + 1)
    ses_mse = _flat_mse(future, levels[:, :, :-1])  # (alphas, n)
    ses_mse = np.where(np.isfinite(ses_mse), ses_mse, np.inf)
    best = np.argmin(ses_mse, axis=0)
    inv = (1.0 / (ses_mse + tiny(hist)[None, :])).T  # (n, A)
    ends = np.append(origins, t - 1)
    flat = {
        "ses": levels[best, np.arange(n)],
        "ses_avg": smoothed_average(levels, inv),
        "window_mean": window_means_at(hist, ends, WINDOW_MEAN_POINTS),
        "window_mean_long": window_means_at(hist, ends, LONG_MEAN_POINTS),
        "last_value": np.concatenate([hist[:, origins], last_finite(hist)[:, None]], axis=1),
    }
    paths = {name: level[:, :-1, None] for name, level in flat.items()}  # flat: (n, O, 1)
    live = {name: level[:, -1:] for name, level in flat.items()}
    rows, at = np.repeat(np.arange(n), origins.size), np.tile(origins, n)
    rolled = arima.roll_from(c, hist, rows, at, steps).reshape(n, origins.size, steps)
    usable: BoolArray = np.asarray(np.isfinite(live_arima).all(axis=1))
    paths["arima"] = np.where(usable[:, None, None], rolled, np.nan)
    live["arima"] = live_arima
    errors, mse = {}, {}
    for name, path in paths.items():
        errors[name], mse[name] = _mae_mse(future - path)
    optimism = _optimism(arima, hist, origins.size)
    corrected = {m: mse[m] * optimism[m] + tiny(hist) for m in MEMBERS}
    with np.errstate(invalid="ignore", divide="ignore"):
        inverse = [np.where(np.isfinite(mse[m]), 1.0 / corrected[m], 0.0) for m in MEMBERS]
    raw = np.stack(inverse, axis=1)
    weights = normalized(raw, live)
    paths["ensemble"] = combine(weights, paths)
    errors["ensemble"] = _mae_mse(future - paths["ensemble"])[0]
    chosen = ("ensemble", "last_value")
    top = _nanmax(future)
    live_paths = {
        "ensemble": combine(weights, live),
        "last_value": np.repeat(live["last_value"], steps, axis=1),
    }
    residuals = {k: future - paths[k] for k in chosen}
    peaks = {k: top - _nanmax(np.broadcast_to(paths[k], future.shape)) for k in chosen}
    return Assessment(errors, raw, best, inv, live_paths, residuals, peaks, int(origins[-1]))


def _flat_mse(future: FloatArray, level: FloatArray) -> FloatArray:
    """Mean squared error (..., n) of flat paths at `level` (..., n, origins) against
    `future` (n, origins, steps), ignoring gaps, as s2 - 2 L s1 + L^2 s0."""
    finite = np.isfinite(future)
    y = np.where(finite, future, 0.0)
    s0, s1, s2 = finite.sum(axis=2), y.sum(axis=2), (y * y).sum(axis=2)  # (n, origins)
    ok = np.isfinite(level) & (s0 > 0)
    sq = np.where(ok, s2 - 2 * level * s1 + level**2 * s0, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        out: FloatArray = np.maximum(sq, 0.0).sum(axis=-1) / np.where(ok, s0, 0).sum(axis=-1)
    return out


def smoothed_average(levels: FloatArray, inv: FloatArray) -> FloatArray:
    """Smoothing averaged over its constants by inverse recent squared error: `levels`
    (alphas, n, ...) and `inv` (n, alphas) give (n, ...)."""
    w = inv.T.reshape(inv.shape[1], inv.shape[0], *([1] * (levels.ndim - 2)))
    out: FloatArray = (w * levels).sum(axis=0) / w.sum(axis=0)
    return out


def tiny(hist: FloatArray) -> FloatArray:
    """A squared error too small to tell from zero, per row (keeps 1/MSE finite)."""
    out: FloatArray = 1e-12 * (1.0 + nanmean_rows(hist * hist))
    return out


def _mae_mse(resid: FloatArray) -> tuple[FloatArray, FloatArray]:
    """MAE and MSE per row of (n, ...), ignoring NaN (NaN for a row with none)."""
    flat = resid.reshape(resid.shape[0], -1)
    finite = np.isfinite(flat)
    count = finite.sum(axis=1)
    r = np.where(finite, flat, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mae = np.abs(r).sum(axis=1) / count
        mse = (r * r).sum(axis=1) / count
    return np.where(count > 0, mae, np.nan), np.where(count > 0, mse, np.nan)


def _nanmax(a: FloatArray) -> FloatArray:
    """Max over the last axis ignoring NaN (NaN where all are), without a warning."""
    with np.errstate(invalid="ignore"):
        out: FloatArray = np.fmax.reduce(a, axis=-1)
    return out


def _optimism(arima: Arima, hist: FloatArray, origins: int) -> dict[str, FloatArray]:
    """(m + k) / (m - k) per member: k parameters fitted on the m points scored."""
    n = hist.shape[0]
    k = arima.p + int(arima.const)
    m = np.maximum(np.isfinite(hist).sum(axis=1) - arima.d - arima.p, k + 1).astype(float)
    chosen = np.full(n, (origins + 1) / max(origins - 1, 1))
    return {"arima": (m + k) / (m - k), "ses": chosen, "ses_avg": chosen, "window_mean": np.ones(n)}


def normalized(raw: FloatArray, paths: Mapping[str, FloatArray]) -> FloatArray:
    """`raw` weights (n, members) normalized per row over the members whose path is
    finite everywhere (all 0 where none is), after `toward_arima`."""
    usable = np.stack(
        [np.isfinite(paths[m]).reshape(raw.shape[0], -1).all(axis=1) for m in MEMBERS], axis=1
    )
    kept = toward_arima(np.where(usable, raw, 0.0))
    total = kept.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        out: FloatArray = np.where(total > 0, kept / total, 0.0)
    return out


def toward_arima(raw: FloatArray) -> FloatArray:
    """Weights (n, members) with every other member's scaled by how clearly it beats
    ARIMA: 0 while its corrected error is at or above ARIMA's, rising linearly to its full
    weight once ARIMA's is ARIMA_MARGIN above its; unchanged where ARIMA has no weight."""
    arima = raw[:, :1]
    has = arima > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        lead = raw[:, 1:] / np.where(has, arima, 1.0) - 1.0
    gate = np.clip(lead / ARIMA_MARGIN, 0.0, 1.0)
    out = raw.copy()
    out[:, 1:] = np.where(has, raw[:, 1:] * gate, raw[:, 1:])
    return out


def combine(weights: FloatArray, paths: Mapping[str, FloatArray]) -> FloatArray:
    """The weighted mean of the members' paths over those finite at each point (NaN: none).
    `weights` (n, members); the paths (n, ...) broadcast (a flat member's last axis is 1)."""
    shape = np.broadcast_shapes(*(paths[m].shape for m in MEMBERS))
    total, wsum = np.zeros(shape), np.zeros(shape)
    for i, m in enumerate(MEMBERS):
        path = paths[m]
        w = weights[:, i].reshape((-1,) + (1,) * (len(shape) - 1))
        finite = np.isfinite(path)
        total += np.where(finite, path, 0.0) * w
        wsum += finite * w
    with np.errstate(invalid="ignore", divide="ignore"):
        out: FloatArray = np.where(wsum > 0, total / wsum, np.nan)
    return out


def choose_method(errors: Mapping[str, float]) -> str | None:
    """The ensemble, unless the last value's recent error is more than FALLBACK_MARGIN
    lower (or the ensemble has none); None without the last value's error."""
    if "last_value" not in errors:
        return None
    ens = errors.get("ensemble", np.nan)
    if not np.isfinite(ens) or errors["last_value"] < ens * (1 - FALLBACK_MARGIN):
        return "last_value"
    return "ensemble"


def live_members(
    hist: FloatArray,
    filled: FloatArray,
    ses_best: IntArray,
    ses_inv: FloatArray,
    arima_path: FloatArray,
) -> dict[str, FloatArray]:
    """Every member's path at the newest point (flat ones (n, 1), ARIMA (n, steps)) and
    the last value, with the kept smoothing constant and its weights (`filled`: `hist`
    forward-filled)."""
    n, t = hist.shape
    levels = ses_at(hist, filled, np.array([t - 1]))[:, :, 0]  # (alphas, n)
    return {
        "arima": arima_path,
        "ses": levels[ses_best, np.arange(n)][:, None],
        "ses_avg": smoothed_average(levels, ses_inv)[:, None],
        "window_mean": window_means_at(hist, np.array([t - 1]), WINDOW_MEAN_POINTS),
        "last_value": last_finite(hist)[:, None],
    }


def errors_at(
    arima: Arima,
    c: Coefficients,
    hist: FloatArray,
    filled: FloatArray,
    rows: IntArray,
    origins: IntArray,
    kept: tuple[FloatArray, IntArray, FloatArray, BoolArray],
    usable: BoolArray,
    steps: int,
) -> tuple[FloatArray, FloatArray]:
    """The chosen method's absolute errors (pairs, steps) and peak errors (pairs,) at
    origin `origins[i]` of row `rows[i]` of `hist` (`filled`: forward-filled), with that
    row's kept coefficients, and `kept`:
    its raw weights (n, members), best smoothing constant (n,), the constants' inverse
    errors (n, alphas), and whether its method is the ensemble (else the last value)."""
    raw, ses_best, ses_inv, ensemble = kept
    ends = np.unique(origins)
    at = np.searchsorted(ends, origins)
    levels = ses_at(hist, filled, ends)[:, rows, at]  # (alphas, pairs)
    members = {
        "ses": levels[ses_best[rows], np.arange(rows.size)][:, None],
        "ses_avg": smoothed_average(levels, ses_inv[rows])[:, None],
        "window_mean": window_means_at(hist, ends, WINDOW_MEAN_POINTS)[rows, at][:, None],
    }
    rolled = arima.roll_from(c, hist, rows, origins, steps)
    members["arima"] = np.where(usable[rows][:, None], rolled, np.nan)
    mixed = combine(normalized(raw[rows], members), members)
    path = np.where(ensemble[rows][:, None], mixed, hist[rows, origins][:, None])
    actual = hist[rows[:, None], origins[:, None] + np.arange(1, steps + 1)[None, :]]
    errors: FloatArray = np.abs(actual - path)
    return errors, _nanmax(actual) - _nanmax(path)
