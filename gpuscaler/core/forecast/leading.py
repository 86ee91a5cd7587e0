"""Leading signals: a workload's demand (request rate, queue length) forecast and mapped to
GPU load through a fitted per-workload ratio. Pure computation.

GPU work follows the requests that cause it, so a demand series can tell the load's
future before the load shows it. Per workload, on the forecast's bucket grid:

- the ratio: `load[t] ~ a + b * demand[t - lag]` by least squares for every lag of 0 to
  MAX_LAG buckets, keeping the lag with the least residual error (its residual standard
  deviation is the ratio's own error, named in the reason);
- the demand's own forecast: the same evidence-weighted ensemble as any series (or its
  last value when that has clearly been better); the mapped path at step h is
  `a + b * demand[t + h - lag]`, observed demand for h <= lag;
- which signal wins: at the same in-window origins as the load's own forecast, the
  mapped path's recent error against the actual load (inflated by (m + k) / (m - k) for
  the k = 3 numbers fitted on the m points) against the load forecast's recent error.
  The demand wins when its error is LEAD_MARGIN lower; its interval is split-conformal
  from its own in-window errors (ratio and demand-forecast error together) at the
  series' adaptive level, its peak the path's maximum plus the median recent peak error.

Either way the reason says which signal won and by how much.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast.engines import (
    LeastSquaresArima,
    bucket,
    stable_fit,
    within_band,
)
from gpuscaler.core.forecast.ensemble import (
    WINDOW_MEAN_POINTS,
    assess,
    choose_method,
    forward_fill,
    origins_for,
)
from gpuscaler.core.forecast.intervals import conformal_half_width, peak_offset, reissue
from gpuscaler.core.model import FitState, FloatArray, Forecast, Series, Signal

MAX_LAG = 6
"""Lags of the demand tried for the ratio, in buckets (1 min at 10 s): GPU work follows a
request by its queueing and service time."""
LEAD_MARGIN = 0.05
"""The demand-mapped path replaces the load's own forecast only when its recent error is
5 % lower: a smaller lead is within the noise of the in-window scores."""
RATIO_PARAMS = 3
"""Numbers fitted for the mapping: intercept, ratio and lag."""


@dataclass(frozen=True)
class Ratio:
    """load ~ intercept + ratio * demand[t - lag]; `error`: residual standard deviation."""

    intercept: float
    ratio: float
    lag: int
    error: float
    points: int


def fit_ratio(load: FloatArray, demand: FloatArray, max_lag: int = MAX_LAG) -> Ratio | None:
    """The least-squares mapping from demand to load with the best lag (None when fewer
    than 2 * RATIO_PARAMS + 2 paired points or no demand variation at any lag)."""
    best: Ratio | None = None
    for lag in range(0, min(max_lag, len(load) - 1) + 1):
        y, x = load[lag:], demand[: len(demand) - lag]
        ok = np.isfinite(x) & np.isfinite(y)
        m = int(ok.sum())
        if m < 2 * RATIO_PARAMS + 2:
            continue
        xs, ys = x[ok], y[ok]
        xm, ym = float(xs.mean()), float(ys.mean())
        var = float(((xs - xm) ** 2).sum())
        if var <= 1e-12 * max(1.0, xm * xm) * m:
            continue
        b = float(((xs - xm) * (ys - ym)).sum()) / var
        a = ym - b * xm
        sd = float(np.sqrt(((ys - a - b * xs) ** 2).sum() / max(m - 2, 1)))
        if best is None or sd < best.error:
            best = Ratio(a, b, lag, sd, m)
    return best


@dataclass(frozen=True, eq=False)
class _Mapped:
    """The demand-mapped load path: live (steps,), in-window residuals (O, steps)."""

    live: FloatArray
    residuals: FloatArray
    peak_errors: FloatArray
    error: float
    demand_method: str


def lead(
    signal: Signal,
    load: Series,
    demand: Series | None,
    cfg: ForecastConfig,
    now: float,
    key: str | None = None,
    states: dict[str, FitState] | None = None,
    demand_problem: str | None = None,
    clip: tuple[float, float | None] = (0.0, None),
) -> Signal:
    """The load's signal with the demand-mapped forecast in its place when that has been
    clearly more accurate on recent history; its reason says which signal won. With `key`,
    the interval issued for the series in `states` is the one finally used."""
    f = signal.forecast
    if f is None:
        return signal
    why, mapped, ratio = _try_lead(f, load, demand, cfg, now, demand_problem)
    if mapped is None or ratio is None:
        return replace(signal, forecast=replace(f, reason=f"{f.reason}; {why}"))
    own = f.errors[f.method]
    about = (
        f"demand (lag {ratio.lag * cfg.fit_step:g}s, {ratio.ratio:.4g} load per unit "
        f"+ {ratio.intercept:.4g}, ratio error {ratio.error:.3g}; demand forecast by "
        f"{mapped.demand_method})"
    )
    if not mapped.error < own * (1 - LEAD_MARGIN):
        note = (
            f"leading signal: GPU load's own forecast won (recent error {own:.3g} vs "
            f"{about} {mapped.error:.3g})"
        )
        errors = {**f.errors, "demand": mapped.error}
        return replace(signal, forecast=replace(f, reason=f"{f.reason}; {note}", errors=errors))
    out = _demand_forecast(f, mapped, about, own, clip, key, states)
    return replace(signal, forecast=out)


def _try_lead(
    f: Forecast,
    load: Series,
    demand: Series | None,
    cfg: ForecastConfig,
    now: float,
    demand_problem: str | None,
) -> tuple[str, _Mapped | None, Ratio | None]:
    """The mapped path and its ratio, or why the demand cannot be compared."""
    if demand_problem:
        return f"demand not used: {demand_problem}", None, None
    if demand is None or demand.last_sample_time() is None:
        return "demand not used: no samples", None, None
    if f.method not in f.errors:
        return "demand not compared: too little history to score the load", None, None
    p, d, _q = cfg.order
    if cfg.engine != "fast" or not cfg.ensemble:
        return "demand not compared: needs the fast engine with the ensemble", None, None
    lh = bucket(load, cfg.fit_step, now).values
    dh = bucket(demand, cfg.fit_step, now).values
    w = min(len(lh), len(dh))
    lh, dh = lh[len(lh) - w :], dh[len(dh) - w :]
    steps = len(f.mean)
    ratio = fit_ratio(lh, dh, min(MAX_LAG, steps - 1))
    if ratio is None:
        return "demand not used: too few paired points or no variation", None, None
    mapped = _map(LeastSquaresArima(p, d), lh, dh, ratio, steps, cfg.interval_level)
    if mapped is None:
        return "demand not compared: too little history to score it", None, None
    return "", mapped, ratio


def _map(
    engine: LeastSquaresArima,
    lh: FloatArray,
    dh: FloatArray,
    ratio: Ratio,
    steps: int,
    level: float,
) -> _Mapped | None:
    """Forecast the demand (live and at every in-window origin) and map it to load."""
    hist = dh[None, :]
    fitted = engine.fit(hist)
    paths = engine.predict(fitted, hist, steps, level)
    ok = stable_fit(fitted) & np.isfinite(paths.mean).all(axis=1) & within_band(paths.mean, hist)
    a = assess(engine, fitted, hist, steps, paths.mean, ok)
    if a is None:
        return None
    errors = {k: float(v[0]) for k, v in a.errors.items() if np.isfinite(v[0])}
    if "last_value" not in errors:
        return None
    method = choose_method(errors)
    w = len(dh)
    origins = origins_for(w, steps, max(engine.p + engine.d + 2, WINDOW_MEAN_POINTS))
    ahead = origins[:, None] + 1 + np.arange(steps)[None, :]
    window_path = dh[ahead] - a.residuals[method][0]  # (O, steps), NaN where unobserved
    filled = forward_fill(hist)[0]
    lag = ratio.lag
    known = filled[origins[:, None] - lag + 1 + np.arange(lag)[None, :]]  # (O, lag)
    in_window = np.concatenate([known, window_path[:, : steps - lag]], axis=1)
    live_demand = np.concatenate([filled[w - lag :], a.paths[method][0][: steps - lag]])
    mapped = ratio.intercept + ratio.ratio * in_window
    future = lh[ahead]
    resid = future - mapped
    inflate = (ratio.points + RATIO_PARAMS) / max(ratio.points - RATIO_PARAMS, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        error = float(np.nanmean(np.abs(resid))) * inflate
        peaks = np.nanmax(future, axis=1) - np.nanmax(mapped, axis=1)
    if not np.isfinite(error):
        return None
    live = ratio.intercept + ratio.ratio * live_demand
    return _Mapped(live, resid, peaks, error, method)


def _demand_forecast(
    f: Forecast,
    mapped: _Mapped,
    about: str,
    own: float,
    clip: tuple[float, float | None],
    key: str | None,
    states: dict[str, FitState] | None,
) -> Forecast:
    """The forecast from the demand-mapped path, its conformal interval and peak."""
    state = states.get(key) if states is not None and key is not None else None
    level = state.interval.level if state is not None and state.interval else f.level
    half = conformal_half_width(np.abs(mapped.residuals)[None], np.array([level]))[0]
    if not np.all(np.isfinite(half)):
        half = f.upper - f.mean
    lo, hi = clip
    mean = np.clip(mapped.live, lo, hi)
    lower, upper = np.clip(mean - half, lo, hi), np.clip(mean + half, lo, hi)
    top = float(mean.max())
    peak = float(np.clip(top + float(peak_offset(mapped.peak_errors[None])[0]), lo, hi)) - top
    if state is not None and state.interval is not None and states is not None:
        assert key is not None
        states[key] = replace(state, interval=reissue(state.interval, lower, upper))
    reason = (
        f"leading signal: {about} won, recent error {mapped.error:.3g} vs GPU load's own "
        f"forecast ({f.method}) {own:.3g}; instead of: {f.reason}"
    )
    return replace(
        f,
        mean=mean,
        lower=lower,
        upper=upper,
        method="demand",
        reason=reason,
        errors={**f.errors, "demand": mapped.error},
        peak_error=peak,
    )
