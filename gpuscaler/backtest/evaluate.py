"""Rolling-origin errors of every method on one series."""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np

from gpuscaler.backtest.series import BacktestError
from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast import (
    EMPTY,
    WINDOW_MEAN_POINTS,
    StatsmodelsArima,
    forecast,
    lead,
    reissued,
)
from gpuscaler.core.model import FloatArray, IntArray, Series


class Reference(Protocol):
    """A forecaster compared against (statsmodels' ARIMA by default)."""

    def forecast(
        self, hist: FloatArray, steps: int, level: float
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Mean, lower and upper paths (n, steps) continuing each row of `hist`."""
        ...


@dataclass(frozen=True)
class Scores:
    mae: float
    relative_to_naive: float
    peak_mae: float
    coverage: float
    origins: int
    demand_won: float = math.nan

    def as_dict(self) -> dict[str, float | int | None]:
        """Each figure rounded; `demand_won` only when there was a demand."""
        out = {k: v if k == "origins" else rounded(v) for k, v in asdict(self).items()}
        if not math.isfinite(self.demand_won):
            del out["demand_won"]
        return out


def rounded(x: float) -> float | None:
    return round(float(x), 4) if math.isfinite(x) else None


@dataclass
class Errors:
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
    with warnings.catch_warnings(action="ignore", category=RuntimeWarning):
        if kind == "window_mean":
            windows = np.lib.stride_tricks.sliding_window_view(hist, k, axis=1)
            means = np.nanmean(windows, axis=2)  # means[:, j] ends at hist[:, j + k - 1]
        for h in range(1, steps + 1):
            if kind == "naive":
                err = hist[:, h:] - hist[:, : w - h]
            else:
                err = hist[:, k - 1 + h :] - means[:, : w - k + 1 - h]
            if err.shape[1] == 0:
                continue
            lower[:, h - 1] = point[:, h - 1] + np.nanquantile(err, lo_q, axis=1)
            upper[:, h - 1] = point[:, h - 1] + np.nanquantile(err, hi_q, axis=1)
    return lower, upper


def _gpuscaler_paths(
    hist: FloatArray,
    origins: IntArray,
    step: float,
    fcfg: ForecastConfig,
    demand: FloatArray | None = None,
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
    """The production forecaster at each origin in time order, as the controller runs it:
    the fit states (refit every forecast.refit_every, the adaptive interval level) carried
    from one origin to the next, and with `demand` windows (origins, window) the leading
    signal. Mean, lower, upper (origins, steps), the peak, and per origin 1 where the
    demand won (NaN without a demand)."""
    n, win = hist.shape
    steps = round(fcfg.horizon / step)
    mean, lower, upper = (np.full((n, steps), np.nan) for _ in range(3))
    peak, won = np.full(n, np.nan), np.full(n, np.nan)
    state = EMPTY
    clip = (-math.inf, None)
    for r in range(n):
        now = float(origins[r]) * step
        s = Series(start=now - step * (win - 1), step=step, values=hist[r])
        (sig,), found = forecast([s], fcfg, now, state, keys=["s"], clips=[clip])
        if demand is not None and (rows := found.get("s")) is not None:
            d = Series(start=s.start, step=step, values=demand[r])
            level = float(rows.adaptive.level[0])
            sig, used = lead(sig, s, d, fcfg, now, level, clip=clip)
            if used and sig.forecast is not None:
                found = reissued(found, "s", now, sig.forecast.lower, sig.forecast.upper)
        state = found if found.batches else state
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
    reference: Reference | None = None,
    demand: Series | None = None,
) -> dict[str, Errors]:
    """Errors of every method at up to `max_origins` origins of `series` (with `demand`,
    on the same grid, the leading signal too)."""
    step = series.step
    steps, origins, idx, hist, actual = _origins(series, cfg, horizon, window, max_origins)
    fitted = {"horizon": steps * step, "fit_step": step, "min_history": step * (sum(cfg.order) + 2)}
    fcfg = cfg.model_copy(update=fitted)
    level = cfg.interval_level
    paths: dict[str, tuple[FloatArray, FloatArray, FloatArray]] = {}
    peaks: dict[str, FloatArray] = {}
    d_hist = demand.values[idx] if demand is not None else None
    g_mean, g_lo, g_hi, peaks["gpuscaler"], won = _gpuscaler_paths(
        hist, origins, step, fcfg, d_hist
    )
    paths["gpuscaler"] = (g_mean, g_lo, g_hi)
    if d_hist is not None:
        *band, peaks["gpuscaler_load_only"], _ = _gpuscaler_paths(hist, origins, step, fcfg)
        paths["gpuscaler_load_only"] = (band[0], band[1], band[2])
    naive = np.repeat(hist[:, -1:], steps, axis=1)
    paths["naive"] = (naive, *_empirical_interval(hist, naive, steps, level, "naive"))
    with warnings.catch_warnings(action="ignore", category=RuntimeWarning):
        wm = np.nanmean(hist[:, -WINDOW_MEAN_POINTS:], axis=1)
    wmean = np.repeat(wm[:, None], steps, axis=1)
    paths["window_mean"] = (wmean, *_empirical_interval(hist, wmean, steps, level, "window_mean"))
    reference = reference or StatsmodelsArima(cfg.order)
    paths["statsmodels_arima"] = reference.forecast(hist, steps, level)
    return _errors(paths, peaks, actual, won if demand is not None else None)


def scores(errors: dict[str, Errors]) -> dict[str, Scores]:
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


def _origins(
    series: Series, cfg: ForecastConfig, horizon: float, window: float, max_origins: int
) -> tuple[int, IntArray, IntArray, FloatArray, FloatArray]:
    """Forecast steps, and up to `max_origins` evenly spread origins with a finite last
    value and some finite future: their indexes, windows of history and actual values."""
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
    return steps, origins, idx, hist, actual


def _errors(
    paths: dict[str, tuple[FloatArray, FloatArray, FloatArray]],
    peaks: dict[str, FloatArray],
    actual: FloatArray,
    won: FloatArray | None,
) -> dict[str, Errors]:
    """Per method: mean absolute error, peak error and interval coverage per origin (and
    where the demand signal won, for gpuscaler with one)."""
    out: dict[str, Errors] = {}
    finite = np.isfinite(actual)
    with warnings.catch_warnings(action="ignore", category=RuntimeWarning):
        actual_peak = np.nanmax(np.where(finite, actual, -np.inf), axis=1)
        for method, (mean, lo, hi) in paths.items():
            ok = finite & np.isfinite(mean)
            path_peak = np.nanmax(np.where(ok, mean, -np.inf), axis=1)
            if method in peaks:  # gpuscaler's own peak forecast, not the path's maximum
                path_peak = np.where(np.isfinite(peaks[method]), peaks[method], path_peak)
            rows = ok.any(axis=1)
            abs_err = np.where(ok, np.abs(mean - actual), np.nan)
            inside = np.where(
                ok & np.isfinite(lo) & np.isfinite(hi), (actual >= lo) & (actual <= hi), np.nan
            )
            out[method] = Errors(
                abs_err=list(np.nanmean(abs_err[rows], axis=1)),
                peak_err=list(np.abs(path_peak - actual_peak)[rows]),
                inside=list(np.nanmean(inside[rows], axis=1)),
                won=list(won[rows]) if method == "gpuscaler" and won is not None else [],
            )
    return out
