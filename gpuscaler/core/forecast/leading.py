"""Leading signals: a workload's demand (request rate, queue length), which GPU work
follows, forecast and mapped to GPU load. Per workload, on the forecast's bucket grid:

- the ratio `load[t] ~ a + b * demand[t - lag]` by least squares at the lag (0 to MAX_LAG
  buckets) with the least residual error;
- the demand's own forecast by the same ensemble as any series, mapped through the ratio
  (observed demand for steps within the lag);
- at the in-window origins, the load's own forecast and the mapped path weighted by their
  inverse recent squared error (the mapped path's inflated for the ratio's fitted
  numbers). The combination replaces the load's forecast only when its recent error is
  lower (by LEAD_MARGIN), with a split-conformal interval from its own in-window errors;
  the reason says which signal won and by how much.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast.arima import Arima, inverse_root_modulus, stable, within_band
from gpuscaler.core.forecast.ensemble import assess, choose_method, lowest_origin, origins_for
from gpuscaler.core.forecast.intervals import conformal_half_width, peak_offset
from gpuscaler.core.forecast.members import bucket, forward_fill, sampled
from gpuscaler.core.model import FloatArray, Forecast, Series, Signal

MAX_LAG = 6
"""Lags of the demand tried for the ratio, in buckets (1 min at 10 s): GPU work follows a
request by its queueing and service time."""
LEAD_MARGIN = 0.0
"""How much lower the combination's recent error must be (a margin only cost accuracy on
bench/forecast_leading.py's windows)."""
STALE_BUCKETS = 2
"""A demand whose newest sample is older than this many buckets is not used."""
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
    """The combined path: live (steps,), in-window residuals (O, steps), recent errors,
    the demand's weight."""

    live: FloatArray
    residuals: FloatArray
    peak_errors: FloatArray
    error: float
    own_error: float
    demand_error: float
    weight: float
    demand_method: str


def lead(
    signal: Signal,
    load: Series,
    demand: Series | None,
    cfg: ForecastConfig,
    now: float,
    level: float | None = None,
    demand_problem: str | None = None,
    clip: tuple[float, float | None] = (0.0, None),
) -> tuple[Signal, bool]:
    """The load's signal, or its combination with the demand-mapped path when that has been
    more accurate (interval at the series' adaptive `level`); and whether it replaced the
    forecast (its interval is then the one to track)."""
    f = signal.forecast
    if f is None:
        return signal, False
    why, mapped, ratio = _try_lead(f, load, demand, cfg, now, demand_problem)
    if mapped is None or ratio is None:
        return replace(signal, forecast=replace(f, reason=f"{f.reason}; {why}")), False
    about = (
        f"demand (lag {ratio.lag * cfg.fit_step:g}s, {ratio.ratio:.4g} load per unit "
        f"+ {ratio.intercept:.4g}, ratio error {ratio.error:.3g}; demand forecast by "
        f"{mapped.demand_method}; recent error {mapped.demand_error:.3g})"
    )
    errors = {**f.errors, "demand": mapped.demand_error, "with_demand": mapped.error}
    if not mapped.error < mapped.own_error * (1 - LEAD_MARGIN):
        note = (
            f"leading signal: GPU load's own forecast won (recent error "
            f"{mapped.own_error:.3g}; with {about} {mapped.error:.3g})"
        )
        forecast = replace(f, reason=f"{f.reason}; {note}", errors=errors)
        return replace(signal, forecast=forecast), False
    out = _demand_forecast(f, mapped, about, clip, level)
    return replace(signal, forecast=replace(out, errors=errors)), True


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
    newest = sampled([demand])[0][0]
    if demand is None or newest is None:
        return "demand not used: no samples", None, None
    if now - newest > STALE_BUCKETS * cfg.fit_step:
        return f"demand not used: its newest sample is {now - newest:.0f}s old", None, None
    if f.method not in f.errors:
        return "demand not compared: too little history to score the load", None, None
    p, d, _q = cfg.order
    if cfg.engine != "fast" or not cfg.ensemble:
        return "demand not compared: needs the fast engine with the ensemble", None, None
    lh = bucket(load, cfg.fit_step, now)
    dh = bucket(demand, cfg.fit_step, now)
    w = min(len(lh), len(dh))
    lh, dh = lh[len(lh) - w :], dh[len(dh) - w :]
    steps = len(f.mean)
    ratio = fit_ratio(lh, dh, min(MAX_LAG, steps - 1))
    if ratio is None:
        return "demand not used: too few paired points or no variation", None, None
    mapped = _map(Arima(p, d), lh, dh, ratio, f)
    if mapped is None:
        why = "too little history to score it, or its path leaves the window's range"
        return f"demand not used: {why}", None, None
    return "", mapped, ratio


def _scored(
    arima: Arima, row: FloatArray, steps: int, method: str | None
) -> tuple[str, FloatArray, FloatArray] | None:
    """A series' forecast by `method` (or `choose_method`'s): its live path and its paths
    at the in-window origins (O, steps)."""
    hist = row[None, :]
    c = arima.fit(hist)
    mean = arima.predict(c, hist, steps)
    ok = stable(inverse_root_modulus(c.phi)) & np.isfinite(mean).all(axis=1)
    ok &= within_band(mean, hist)
    a = assess(arima, c, hist, steps, np.where(ok[:, None], mean, np.nan))
    if a is None:
        return None
    errors = {k: float(v[0]) for k, v in a.errors.items() if np.isfinite(v[0])}
    method = method or choose_method(errors)
    if method is None:
        return None
    origins = origins_for(len(row), steps, lowest_origin(arima))
    ahead = origins[:, None] + 1 + np.arange(steps)[None, :]
    return method, a.live[method][0], row[ahead] - a.residuals[method][0]


def _map(arima: Arima, lh: FloatArray, dh: FloatArray, ratio: Ratio, f: Forecast) -> _Mapped | None:
    """Forecast the demand (live and at every in-window origin), map it to load, and
    weight it against the load's own forecast by inverse recent squared error."""
    steps = len(f.mean)
    demand = _scored(arima, dh, steps, None)
    own = _scored(arima, lh, steps, f.method)
    if demand is None or own is None:
        return None
    method, d_live, d_window = demand
    w = len(dh)
    origins = origins_for(w, steps, lowest_origin(arima))
    filled = forward_fill(dh[None, :])[0]
    lag = ratio.lag
    known = filled[origins[:, None] - lag + 1 + np.arange(lag)[None, :]]  # (O, lag)
    a, b = ratio.intercept, ratio.ratio
    mapped = a + b * np.concatenate([known, d_window[:, : steps - lag]], axis=1)
    live = a + b * np.concatenate([filled[w - lag :], d_live[: steps - lag]])
    future = lh[origins[:, None] + 1 + np.arange(steps)[None, :]]
    inflate = (ratio.points + RATIO_PARAMS) / max(ratio.points - RATIO_PARAMS, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mse_d = float(np.nanmean((future - mapped) ** 2)) * inflate
        mse_l = float(np.nanmean((future - own[2]) ** 2))
        weight = (1 / mse_d) / (1 / mse_d + 1 / mse_l) if mse_d > 0 and mse_l > 0 else 0.0
        combined = weight * mapped + (1 - weight) * own[2]
        resid = future - combined
        error = float(np.nanmean(np.abs(resid))) * inflate**weight
        peaks = np.nanmax(future, axis=1) - np.nanmax(combined, axis=1)
        demand_error = float(np.nanmean(np.abs(future - mapped))) * inflate
        own_error = float(np.nanmean(np.abs(future - own[2])))
    path = weight * live + (1 - weight) * f.mean
    if not (np.isfinite(error) and np.isfinite(weight) and np.isfinite(path).all()):
        return None
    if not within_band(path[None, :], lh[None, :])[0]:
        return None  # the stability rule: a path that leaves the window's band is never used
    return _Mapped(path, resid, peaks, error, own_error, demand_error, weight, method)


def _demand_forecast(
    f: Forecast,
    mapped: _Mapped,
    about: str,
    clip: tuple[float, float | None],
    adaptive: float | None,
) -> Forecast:
    """The forecast from the combined path, its conformal interval and peak."""
    level = adaptive if adaptive is not None else f.level
    half = conformal_half_width(np.abs(mapped.residuals).T[None], np.array([level]))[0]
    if not np.all(np.isfinite(half)):
        half = f.upper - f.mean
    lo, hi = clip
    mean = np.clip(mapped.live, lo, hi)
    lower, upper = np.clip(mean - half, lo, hi), np.clip(mean + half, lo, hi)
    top = float(mean.max())
    peak = float(np.clip(top + float(peak_offset(mapped.peak_errors[None])[0]), lo, hi)) - top
    w = mapped.weight
    winner = (
        f"{about} won (weight {w:.2f} against the GPU load's own forecast)"
        if w >= 0.5
        else f"GPU load's own forecast won (weight {1 - w:.2f}) with {about} at {w:.2f}"
    )
    reason = (
        f"leading signal: {winner}: recent error {mapped.error:.3g} together vs "
        f"{mapped.own_error:.3g} for the load's own forecast ({f.method}); that forecast: "
        f"{f.reason}"
    )
    return replace(
        f,
        mean=mean,
        lower=lower,
        upper=upper,
        method="demand" if w >= 0.5 else f"{f.method}+demand",
        reason=reason,
        peak_error=peak,
    )
