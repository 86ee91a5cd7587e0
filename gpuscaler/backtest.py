"""Rolling-origin backtest of the forecaster against baselines on any CSV of
`timestamp,value[,series]`.

At each origin every method sees the same window of history and forecasts the horizon;
scores are averaged over origins and over the horizon's steps:

- `mae`: mean absolute error over the horizon path;
- `relative_to_naive`: MAE / the last-value forecast's MAE (below 1 beats it);
- `peak_mae`: error of the forecast's maximum over the horizon against the actual maximum;
- `coverage`: share of actual points inside the method's prediction interval.

Methods: `gpuscaler` (the production forecaster, run origin after origin with the fit
states the controller threads from tick to tick: refits, the adaptive interval level; its
peak is `Forecast.peak`), `naive` (last value), `window_mean` (mean of the last
12 points), `statsmodels_arima` (statsmodels ARIMA of the configured order, refitted at
each origin). Baselines' intervals are the empirical quantiles of their own errors at each
step within the window.

With a demand CSV (`--demand`: the workloads' request rate or queue length, same series
names, or one series for all), `gpuscaler` forecasts with the leading signal as the
controller does (`gpuscaler.core.forecast.leading`), `gpuscaler_load_only` without it, and
`demand_won` is the share of origins where the demand-mapped forecast won.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast import (
    WINDOW_MEAN_POINTS,
    ForecastEngine,
    StatsmodelsArima,
    forecast_series,
    lead,
    make_engine,
)
from gpuscaler.core.model import FitState, FloatArray, IntArray, Series
from gpuscaler.errors import InputError
from gpuscaler.sim.trace import (
    TraceError,
    bounded_span,
    finite_times,
    parse_times,
    read_csv,
    regular_step,
)

METHODS = ("gpuscaler", "naive", "window_mean", "statsmodels_arima")
AGGREGATIONS = ("mean", "sum", "max", "count")


class BacktestError(InputError):
    """Input the backtest cannot use; the message says what and where."""


def load_series_csv(path: str | Path) -> dict[str, pd.Series]:
    """Named time series (float values indexed by unix seconds) from a CSV: a time column,
    then either a value column and an optional non-numeric series column, or several
    numeric columns, one series each."""
    p = Path(path)
    try:
        frame = read_csv(p, str(p))
    except TraceError as e:
        raise BacktestError(str(e)) from e
    if frame.shape[1] < 2:
        raise BacktestError(f"{p}: needs a timestamp column and a value column")
    try:
        times = finite_times(parse_times(frame.iloc[:, 0], str(p)), frame, str(p))
    except TraceError as e:
        raise BacktestError(str(e)) from e
    rest = frame.iloc[:, 1:]
    numeric = {c: pd.to_numeric(rest[c], errors="coerce") for c in rest.columns}
    is_numeric = {c: bool(v.notna().any()) for c, v in numeric.items()}
    out: dict[str, pd.Series] = {}
    if len(rest.columns) >= 2 and not is_numeric[rest.columns[1]]:
        value_col, series_col = rest.columns[0], rest.columns[1]
        if not is_numeric[value_col]:
            raise BacktestError(f"{p}: column {value_col!r} has no numeric values")
        for name, idx in frame.groupby(frame[series_col].astype(str)).groups.items():
            values = numeric[value_col].loc[idx].to_numpy(dtype=np.float64)
            out[str(name)] = pd.Series(values, index=times[np.asarray(idx)])
    else:
        for column in rest.columns:
            if is_numeric[column]:
                out[str(column)] = pd.Series(
                    numeric[column].to_numpy(dtype=np.float64), index=times
                )
        if not out:
            raise BacktestError(f"{p}: no numeric value column")
    for name, s in out.items():
        if not np.all(np.diff(s.index.to_numpy()) >= 0):
            raise BacktestError(f"{p}: series {name!r}: timestamps go backwards")
    return out


def _bounded(times: FloatArray, step: float, where: str) -> None:
    try:
        bounded_span(times, step, where)
    except TraceError as e:
        raise BacktestError(str(e)) from e


def to_grid(name: str, s: pd.Series, resample: float | None, agg: str, where: str) -> Series:
    """A regular grid: resampled into `resample`-second bins, or checked to be regular."""
    t = s.index.to_numpy(dtype=np.float64)
    v = s.to_numpy(dtype=np.float64)
    if resample is not None:
        _bounded(t, resample, where)
        bins = np.floor((t - t[0]) / resample).astype(np.int64)
        frame = pd.DataFrame({"bin": bins, "v": v})
        grouped = frame.groupby("bin")["v"]
        counts = grouped.count() if agg != "count" else grouped.size()
        values = grouped.agg(agg) if agg != "count" else grouped.size().astype(float)
        grid = np.full(int(bins[-1]) + 1, np.nan)
        grid[values.index.to_numpy()] = values.to_numpy(dtype=np.float64)
        if agg != "count":
            grid[counts.index.to_numpy()[counts.to_numpy() == 0]] = np.nan
        return Series(start=float(t[0]), step=resample, values=grid)
    if len(t) < 2:
        raise BacktestError(f"{where}: series {name!r} has fewer than 2 points")
    try:
        step = regular_step(t, f"{where}: series {name!r}")
    except TraceError as e:
        raise BacktestError(f"{e}; pass --resample to put it on a grid") from e
    _bounded(t, step, where)
    slots = np.round((t - t[0]) / step).astype(np.int64)
    grid = np.full(int(slots[-1]) + 1, np.nan)
    grid[slots] = v
    return Series(start=float(t[0]), step=step, values=grid)


@dataclass(frozen=True)
class Scores:
    mae: float
    relative_to_naive: float
    peak_mae: float
    coverage: float
    origins: int
    demand_won: float = math.nan

    def as_dict(self) -> dict[str, float | int | None]:
        def r(x: float) -> float | None:
            return round(x, 4) if math.isfinite(x) else None

        out = {
            "mae": r(self.mae),
            "relative_to_naive": r(self.relative_to_naive),
            "peak_mae": r(self.peak_mae),
            "coverage": r(self.coverage),
            "origins": self.origins,
        }
        if math.isfinite(self.demand_won):
            out["demand_won"] = r(self.demand_won)
        return out


@dataclass
class _Errors:
    """Per-origin error sums of one method, pooled later across series."""

    abs_err: list[float]
    peak_err: list[float]
    inside: list[float]
    won: list[float] = field(default_factory=list)
    """Per origin, 1 where the demand-mapped forecast won (gpuscaler with a demand)."""


def _empirical_interval(
    hist: FloatArray, point: FloatArray, steps: int, level: float, kind: str
) -> tuple[FloatArray, FloatArray]:
    """Quantiles of the baseline's own errors at each step inside each history row."""
    n, w = hist.shape
    lo_q, hi_q = (1 - level) / 2, (1 + level) / 2
    lower = np.full((n, steps), np.nan)
    upper = np.full((n, steps), np.nan)
    k = WINDOW_MEAN_POINTS
    if kind == "window_mean":
        windows = np.lib.stride_tricks.sliding_window_view(hist, k, axis=1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            means = np.nanmean(windows, axis=2)  # means[:, j] ends at hist[:, j + k - 1]
    for h in range(1, steps + 1):
        if kind == "naive":
            err = hist[:, h:] - hist[:, : w - h]
        else:
            err = hist[:, k - 1 + h :] - means[:, : w - k + 1 - h]
        if err.shape[1] == 0:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            lower[:, h - 1] = point[:, h - 1] + np.nanquantile(err, lo_q, axis=1)
            upper[:, h - 1] = point[:, h - 1] + np.nanquantile(err, hi_q, axis=1)
    return lower, upper


def _gpuscaler_paths(
    hist: FloatArray,
    origins: IntArray,
    step: float,
    fcfg: ForecastConfig,
    engine: ForecastEngine | None,
    demand: FloatArray | None = None,
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
    """The production forecaster at each origin in time order, as the controller runs it:
    the fit states (refit every forecast.refit_every, the adaptive interval level) carried
    from one origin to the next, and with `demand` windows (origins, window) the leading
    signal. Mean, lower, upper (origins, steps), the peak, and per origin 1 where the
    demand won (NaN without a demand)."""
    engine = engine or make_engine(fcfg)
    n, win = hist.shape
    steps = round(fcfg.horizon / step)
    mean, lower, upper = (np.full((n, steps), np.nan) for _ in range(3))
    peak, won = np.full(n, np.nan), np.full(n, np.nan)
    states: dict[str, FitState] = {}
    clip = (-math.inf, None)
    for r in range(n):
        now = float(origins[r]) * step
        s = Series(start=now - step * (win - 1), step=step, values=hist[r])
        kept: dict[str, FitState] = {}
        (sig,) = forecast_series(
            [s], fcfg, now, engine, clip, keys=["s"], prior=states, states=kept
        )
        if demand is not None:
            d = Series(start=s.start, step=step, values=demand[r])
            sig = lead(sig, s, d, fcfg, now, "s", kept, clip=clip)
        states = kept or states
        if sig.forecast is not None:
            f = sig.forecast
            mean[r], lower[r], upper[r], peak[r] = f.mean, f.lower, f.upper, f.peak
            if demand is not None:
                won[r] = float(f.method == "demand")
    return mean, lower, upper, peak, won


def evaluate_series(
    series: Series,
    cfg: ForecastConfig,
    horizon: float,
    window: float,
    max_origins: int,
    engine: ForecastEngine | None = None,
    reference: ForecastEngine | None = None,
    demand: Series | None = None,
) -> dict[str, _Errors]:
    """Errors of every method at up to `max_origins` origins of `series` (with `demand`,
    on the same grid, the leading signal too)."""
    step = series.step
    steps = max(1, round(horizon / max(step, cfg.fit_step)))
    per = max(1, round(cfg.fit_step / step))  # samples per forecast step
    if per > 1:
        raise BacktestError(
            f"series step {step:g}s is finer than forecast.fit_step {cfg.fit_step:g}s; "
            "pass --resample to the fit step"
        )
    win = max(round(window / step), WINDOW_MEAN_POINTS + 2)
    values = series.values
    first, last = win - 1, len(values) - 1 - steps
    if last < first:
        raise BacktestError(
            f"{len(values)} points hold no origin: need a {win}-point window plus "
            f"{steps} steps of horizon"
        )
    stride = max(1, math.ceil((last - first + 1) / max_origins))
    origins = np.arange(last, first - 1, -stride)[::-1]
    idx = origins[:, None] - np.arange(win)[::-1][None, :]
    hist = values[idx]  # (origins, window)
    actual = values[origins[:, None] + 1 + np.arange(steps)[None, :]]
    keep = np.isfinite(hist[:, -1]) & np.isfinite(actual).any(axis=1)
    origins, hist, actual, idx = origins[keep], hist[keep], actual[keep], idx[keep]
    if origins.size == 0:
        raise BacktestError("no origin with a finite last value and a finite future")
    fcfg = cfg.model_copy(
        update={
            "horizon": steps * step,
            "fit_step": step,
            "min_history": step * (sum(cfg.order) + 2),
        }
    )
    level = cfg.interval_level
    paths: dict[str, tuple[FloatArray, FloatArray, FloatArray]] = {}
    peaks: dict[str, FloatArray] = {}
    d_hist = demand.values[idx] if demand is not None else None
    g_mean, g_lo, g_hi, peaks["gpuscaler"], won = _gpuscaler_paths(
        hist, origins, step, fcfg, engine, d_hist
    )
    paths["gpuscaler"] = (g_mean, g_lo, g_hi)
    if d_hist is not None:
        *band, peaks["gpuscaler_load_only"], _ = _gpuscaler_paths(hist, origins, step, fcfg, engine)
        paths["gpuscaler_load_only"] = (band[0], band[1], band[2])
    last_vals = hist[:, -1]
    naive = np.repeat(last_vals[:, None], steps, axis=1)
    paths["naive"] = (naive, *_empirical_interval(hist, naive, steps, level, "naive"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        wm = np.nanmean(hist[:, -WINDOW_MEAN_POINTS:], axis=1)
    wmean = np.repeat(wm[:, None], steps, axis=1)
    paths["window_mean"] = (wmean, *_empirical_interval(hist, wmean, steps, level, "window_mean"))
    reference = reference or StatsmodelsArima(cfg.order)
    ref = reference.forecast(hist, steps, level)
    paths["statsmodels_arima"] = (ref.mean, ref.lower, ref.upper)
    out: dict[str, _Errors] = {}
    finite = np.isfinite(actual)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        actual_peak = np.nanmax(np.where(finite, actual, -np.inf), axis=1)
    for method, (mean, lo, hi) in paths.items():
        ok = finite & np.isfinite(mean)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            path_peak = np.nanmax(np.where(ok, mean, -np.inf), axis=1)
        if method in peaks:  # gpuscaler's own peak forecast, not the path's maximum
            path_peak = np.where(np.isfinite(peaks[method]), peaks[method], path_peak)
        rows = ok.any(axis=1)
        abs_err = np.where(ok, np.abs(mean - actual), np.nan)
        inside = np.where(
            ok & np.isfinite(lo) & np.isfinite(hi), (actual >= lo) & (actual <= hi), np.nan
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            peak = np.abs(path_peak - actual_peak)
            out[method] = _Errors(
                abs_err=list(np.nanmean(abs_err[rows], axis=1)),
                peak_err=list(peak[rows]),
                inside=list(np.nanmean(inside[rows], axis=1)),
                won=list(won[rows]) if method == "gpuscaler" and demand is not None else [],
            )
    return out


def _scores(errors: dict[str, _Errors]) -> dict[str, Scores]:
    maes = {m: float(np.nanmean(e.abs_err)) if e.abs_err else math.nan for m, e in errors.items()}
    naive = maes.get("naive", math.nan)
    return {
        m: Scores(
            mae=maes[m],
            relative_to_naive=maes[m] / naive if naive and math.isfinite(naive) else math.nan,
            peak_mae=float(np.nanmean(e.peak_err)) if e.peak_err else math.nan,
            coverage=float(np.nanmean(e.inside)) if e.inside else math.nan,
            origins=len(e.abs_err),
            demand_won=float(np.mean(e.won)) if e.won else math.nan,
        )
        for m, e in errors.items()
    }


def backtest(
    path: str | Path,
    cfg: ForecastConfig,
    horizon: float,
    window: float,
    resample: float | None = None,
    agg: str = "mean",
    max_origins: int = 400,
    reference: ForecastEngine | None = None,
    demand_path: str | Path | None = None,
    demand_agg: str | None = None,
) -> dict[str, Any]:
    """Every series of the CSV scored per series and pooled; `worst` names the series on
    which the forecaster did worst relative to the last value. A constant series is
    scored like any other (the last value's error is 0 there). With `demand_path`, each
    series' demand (same name, or the file's only series) is the leading signal."""
    for a in (agg, demand_agg or agg):
        if a not in AGGREGATIONS:
            raise BacktestError(f"--agg must be one of {', '.join(AGGREGATIONS)}, not {a!r}")
    raw = load_series_csv(path)
    demands = load_series_csv(demand_path) if demand_path is not None else None
    methods = METHODS + (("gpuscaler_load_only",) if demands is not None else ())
    if agg == "count" and len(raw) > 1 and len({len(s) for s in raw.values()}) == 1:
        # Counting rows per bin gives the same series whatever the value column.
        first = next(iter(raw.values()))
        if all(np.array_equal(s.index, first.index) for s in raw.values()):
            raw = {"count": first}
    per_series: dict[str, dict[str, Scores]] = {}
    pooled: dict[str, _Errors] = {m: _Errors([], [], []) for m in methods}
    for name, s in raw.items():
        grid = to_grid(name, s, resample, agg, str(path))
        demand = None
        if demands is not None:
            d = _demand_for(name, demands, str(demand_path))
            demand = on_grid(to_grid(name, d, resample, demand_agg or agg, str(demand_path)), grid)
        try:
            errors = evaluate_series(
                grid, cfg, horizon, window, max_origins, reference=reference, demand=demand
            )
        except BacktestError as e:
            raise BacktestError(f"{path}: series {name!r}: {e}") from e
        per_series[name] = _scores(errors)
        for m, errs in errors.items():
            # Pool relative errors by scaling each series by its own naive MAE, so a
            # series with large values does not drown the rest.
            scale = _scale(per_series[name]["naive"].mae, grid.values)
            pooled[m].abs_err += [x / scale for x in errs.abs_err]
            pooled[m].peak_err += [x / scale for x in errs.peak_err]
            pooled[m].inside += errs.inside
            pooled[m].won += errs.won
    overall = _scores(pooled)
    return {
        "horizon_s": horizon,
        "overall": {m: _overall(overall[m], per_series, m) for m in methods},
        "series": {n: {m: sc.as_dict() for m, sc in s.items()} for n, s in per_series.items()},
        "worst": _worst(per_series),
    }


def _demand_for(name: str, demands: dict[str, pd.Series], where: str) -> pd.Series:
    """The demand series named like the load series, or the file's only one."""
    if name in demands:
        return demands[name]
    if len(demands) == 1:
        return next(iter(demands.values()))
    raise BacktestError(
        f"{where}: no demand series named {name!r} (it has {', '.join(sorted(demands))})"
    )


def on_grid(s: Series, grid: Series) -> Series:
    """`s` on `grid`'s time slots (NaN where `s` has no slot); both share one step."""
    if abs(s.step - grid.step) > 1e-9 * grid.step:
        raise BacktestError(f"demand step {s.step:g}s differs from the series' {grid.step:g}s")
    slots = np.round((grid.start - s.start) / s.step).astype(np.int64) + np.arange(len(grid.values))
    inside = (slots >= 0) & (slots < len(s.values))
    values = np.full(len(grid.values), np.nan)
    values[inside] = s.values[slots[inside]]
    return Series(grid.start, grid.step, values)


def _scale(naive_mae: float, values: FloatArray) -> float:
    """What a series' errors are divided by when pooled: its naive MAE, or for a series
    the last value forecasts perfectly (constant), its mean absolute level (1 if 0)."""
    if naive_mae and math.isfinite(naive_mae):
        return naive_mae
    finite = values[np.isfinite(values)]
    level = float(np.mean(np.abs(finite))) if finite.size else 0.0
    return level or 1.0


def _worst(per_series: dict[str, dict[str, Scores]]) -> dict[str, Any]:
    """The series where gpuscaler is worst against the last value (by MAE when no series
    has a relative figure, e.g. all constant)."""
    if not per_series:
        return {}

    def key(name: str) -> tuple[float, float]:
        g = per_series[name]["gpuscaler"]
        rel = g.relative_to_naive if math.isfinite(g.relative_to_naive) else -math.inf
        return rel, g.mae if math.isfinite(g.mae) else -math.inf

    name = max(per_series, key=key)
    return {"series": name, **per_series[name]["gpuscaler"].as_dict()}


def _overall(
    scores: Scores, per_series: dict[str, dict[str, Scores]], method: str
) -> dict[str, float | int | None]:
    """Overall: relative_to_naive and coverage pooled across series (each series' errors
    scaled by its own naive MAE); mae and peak_mae averaged over series in their units."""
    d = scores.as_dict()
    d["mae"] = _round(float(np.mean([s[method].mae for s in per_series.values()])))
    d["peak_mae"] = _round(float(np.mean([s[method].peak_mae for s in per_series.values()])))
    return d


def _round(x: float) -> float | None:
    return round(float(x), 4) if math.isfinite(x) else None
