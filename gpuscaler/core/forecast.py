"""Forecasting: series in, forecasts with intervals out. Pure computation.

Two engines give the same model class, ARIMA(p, d, 0):

- `LeastSquaresArima` fits every series of a batch at once by least squares on the
  d-times differenced series (numpy, batched normal equations). This is the production
  engine: about 100x cheaper per series than statsmodels.
- `StatsmodelsArima` wraps `statsmodels.tsa.arima.model.ARIMA` (any order, q > 0 too):
  the reference the fast engine is measured against.

On top of the engine, `forecast_series` scores, per series and on the series' own recent
history, the model against two baselines (last value, window mean) at the forecast
horizon, and uses whichever was best there, saying so in the forecast's reason.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Protocol

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from gpuscaler.config import ForecastConfig
from gpuscaler.core.model import FloatArray, Forecast, Series, Signal

_RIDGE = 1e-6
"""Tiny ridge on the normal equations: keeps a flat (constant) series solvable."""
_CHUNK = 256
"""Series per batched solve: bounds the design tensor to ~ 256 x window x (p+1) floats."""


@dataclass(frozen=True, eq=False)
class Fitted:
    """Per-series AR coefficients of the differenced series (NaN rows: not fittable)."""

    intercept: FloatArray  # (n,)
    phi: FloatArray  # (n, p)
    sigma2: FloatArray  # (n,)


@dataclass(frozen=True, eq=False)
class PathBatch:
    mean: FloatArray  # (n, steps)
    lower: FloatArray
    upper: FloatArray


class ForecastEngine(Protocol):
    name: str

    def forecast(self, histories: FloatArray, steps: int, level: float) -> PathBatch:
        """Forecast each row of `histories` (n, T; NaN = gap) `steps` ahead."""
        ...


def z_score(level: float) -> float:
    return NormalDist().inv_cdf(0.5 + level / 2)


def last_finite(histories: FloatArray) -> FloatArray:
    """Last finite value of each row (NaN for a row with none)."""
    finite = np.isfinite(histories)
    idx = histories.shape[1] - 1 - np.argmax(finite[:, ::-1], axis=1)
    out: FloatArray = histories[np.arange(histories.shape[0]), idx]
    out[~finite.any(axis=1)] = np.nan
    return out


class LeastSquaresArima:
    """ARIMA(p, d, 0) with intercept, fitted by batched least squares."""

    def __init__(self, p: int, d: int):
        if d not in (0, 1):
            raise ValueError("LeastSquaresArima supports d in {0, 1}")
        self.p, self.d = p, d
        # Like statsmodels' ARIMA: a constant only when the series is not differenced
        # (with d = 1 a constant would be a drift that extrapolates every trend).
        self.const = d == 0
        self.name = f"arima({p},{d},0)"

    def fit(self, histories: FloatArray) -> Fitted:
        z = np.diff(histories, n=self.d, axis=1) if self.d else histories
        n = z.shape[0]
        parts = [self._fit_chunk(z[i : i + _CHUNK]) for i in range(0, n, _CHUNK)]
        return Fitted(
            intercept=np.concatenate([c for c, _, _ in parts]),
            phi=np.concatenate([f for _, f, _ in parts]),
            sigma2=np.concatenate([s for _, _, s in parts]),
        )

    def _fit_chunk(self, z: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        p, k = self.p, self.p + 1
        n = z.shape[0]
        if z.shape[1] <= p:
            nan = np.full(n, np.nan)
            return nan, np.full((n, p), np.nan), nan
        windows = sliding_window_view(z, p + 1, axis=1)  # (n, m, p+1): lags..., target
        valid = np.isfinite(windows).all(axis=2)
        x = np.empty(windows.shape, dtype=np.float64)
        x[..., 0] = 1.0 if self.const else 0.0  # with no constant the ridge pins it at 0
        x[..., 1:] = windows[..., :p][..., ::-1]  # z[t-1], z[t-2], ..., z[t-p]
        x[~valid] = 0.0
        y = np.where(valid, windows[..., p], 0.0)
        xtx = np.einsum("nmk,nml->nkl", x, x) + _RIDGE * np.eye(k)
        xty = np.einsum("nmk,nm->nk", x, y)
        beta = np.linalg.solve(xtx, xty[..., None])[..., 0]
        resid = np.where(valid, y - np.einsum("nmk,nk->nm", x, beta), 0.0)
        count = valid.sum(axis=1)
        dof = count - p - int(self.const)
        sigma2 = (resid**2).sum(axis=1) / np.maximum(dof, 1)
        bad = dof < 2
        beta[bad] = np.nan
        sigma2[bad] = np.nan
        return beta[:, 0], beta[:, 1:], sigma2

    def predict_mean(self, fitted: Fitted, histories: FloatArray, steps: int) -> FloatArray:
        """Mean paths (n, steps) continuing each row of `histories` with `fitted`."""
        z = np.diff(histories, n=self.d, axis=1) if self.d else histories
        lags = z[:, z.shape[1] - self.p :][:, ::-1] if self.p else z[:, :0]
        return self.roll(fitted, lags, last_finite(histories), _nanmean_rows(z), steps)

    def roll(
        self, fitted: Fitted, lags: FloatArray, last: FloatArray, zmean: FloatArray, steps: int
    ) -> FloatArray:
        """Run the recursion `steps` ahead from per-row state: `lags` (rows, p) newest
        first, `last` level (rows,). A gap in the lags is filled with the row's mean
        difference `zmean`, the model's best guess for a missing value."""
        lags = np.where(np.isfinite(lags), lags, zmean[:, None])
        zpath = np.empty((lags.shape[0], steps))
        for h in range(steps):
            nxt = fitted.intercept + (fitted.phi * lags).sum(axis=1)
            zpath[:, h] = nxt
            if self.p:
                lags = np.concatenate([nxt[:, None], lags[:, :-1]], axis=1)
        return last[:, None] + np.cumsum(zpath, axis=1) if self.d else zpath

    def half_width(self, fitted: Fitted, steps: int, level: float) -> FloatArray:
        """Half width (n, steps) of the prediction interval, from the MA(inf) weights."""
        n, p = fitted.phi.shape
        psi = np.zeros((n, steps))
        psi[:, 0] = 1.0
        for j in range(1, steps):
            for i in range(1, min(j, p) + 1):
                psi[:, j] += fitted.phi[:, i - 1] * psi[:, j - i]
        if self.d:
            psi = np.cumsum(psi, axis=1)
        return z_score(level) * np.sqrt(fitted.sigma2[:, None] * np.cumsum(psi**2, axis=1))

    def predict(self, fitted: Fitted, histories: FloatArray, steps: int, level: float) -> PathBatch:
        mean = self.predict_mean(fitted, histories, steps)
        half = self.half_width(fitted, steps, level)
        return PathBatch(mean=mean, lower=mean - half, upper=mean + half)

    def forecast(self, histories: FloatArray, steps: int, level: float) -> PathBatch:
        return self.predict(self.fit(histories), histories, steps, level)


class StatsmodelsArima:
    """Reference engine: statsmodels' state-space ARIMA, one series at a time."""

    def __init__(self, order: tuple[int, int, int]):
        self.order = order
        self.name = f"statsmodels-arima{order}"

    def forecast(self, histories: FloatArray, steps: int, level: float) -> PathBatch:
        from statsmodels.tsa.arima.model import ARIMA

        n = histories.shape[0]
        mean, lower, upper = (np.full((n, steps), np.nan) for _ in range(3))
        for i, row in enumerate(histories):
            if np.isfinite(row).sum() < sum(self.order) + 3:
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    result = ARIMA(row, order=self.order).fit()
                    frame = result.get_forecast(steps).summary_frame(alpha=1 - level)
                except (ValueError, np.linalg.LinAlgError):
                    continue
            mean[i] = frame["mean"].to_numpy()
            lower[i] = frame["mean_ci_lower"].to_numpy()
            upper[i] = frame["mean_ci_upper"].to_numpy()
        return PathBatch(mean, lower, upper)


def make_engine(cfg: ForecastConfig) -> ForecastEngine:
    p, d, _q = cfg.order
    if cfg.engine == "fast":
        return LeastSquaresArima(p, d)
    return StatsmodelsArima(cfg.order)


def _nanmean_rows(a: FloatArray) -> FloatArray:
    finite = np.isfinite(a)
    count = finite.sum(axis=1)
    total = np.where(finite, a, 0.0).sum(axis=1)
    return np.where(count > 0, total / np.maximum(count, 1), 0.0)


# --------------------------------------------------------------------------- resampling


def bucket(series: Series, width: float, end: float) -> Series:
    """Means of `series` over buckets of `width` seconds ending at `end`; NaN where a bucket
    holds no finite sample. Gaps stay gaps."""
    per = max(1, round(width / series.step))
    # Align the last bucket's end with `end` so forecasts start from the same origin.
    offset = round((end - series.end) / series.step)
    values = series.values
    if offset > 0:
        values = np.concatenate([values, np.full(offset, np.nan)])
    elif offset < 0:
        values = values[: len(values) + offset]
    usable = (len(values) // per) * per
    block = values[len(values) - usable :].reshape(-1, per)
    finite = np.isfinite(block)
    counts = finite.sum(axis=1)
    sums = np.where(finite, block, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / counts, np.nan)
    step = per * series.step
    return Series(start=end - step * (len(means) - 1), step=step, values=means)


# --------------------------------------------------------------------------- selection

_ASSESS_ORIGINS = 24
"""In-window forecast origins each method is scored on: enough for a stable mean error,
few enough to cost less than the fit."""
WINDOW_MEAN_POINTS = 12
"""The window-mean baseline averages the last 12 buckets (2 min at 10 s)."""


def _in_window_errors(
    engine: LeastSquaresArima, fitted: Fitted, hist: FloatArray, steps: int
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Mean absolute error at the horizon of model, last value and window mean, each scored
    at the last `_ASSESS_ORIGINS` origins of every row whose outcome is known.

    The model is scored with the coefficients fitted on the whole window (a slight
    in-sample advantage; refitting at each origin would cost 24 fits)."""
    n, t = hist.shape
    p, d = engine.p, engine.d
    spacing = max(1, steps // 4)
    origins = np.array([t - steps - 1 - j * spacing for j in range(_ASSESS_ORIGINS)])
    origins = origins[origins > max(p + d + 2, WINDOW_MEAN_POINTS)]
    if origins.size == 0:
        nan = np.full(n, np.nan)
        return nan, nan, nan
    z = np.diff(hist, n=d, axis=1) if d else hist
    zoff = d  # z[j] belongs to hist[j + d]
    # Rows = series x origins, all rolled forward at once.
    lag_idx = (origins[:, None] - zoff) - np.arange(p)[None, :]  # newest first
    lags = z[:, lag_idx].reshape(n * origins.size, p)
    last = hist[:, origins].reshape(-1)
    zmean = np.repeat(_nanmean_rows(z), origins.size)
    rep = Fitted(
        intercept=np.repeat(fitted.intercept, origins.size),
        phi=np.repeat(fitted.phi, origins.size, axis=0),
        sigma2=np.repeat(fitted.sigma2, origins.size),
    )
    model = engine.roll(rep, lags, last, zmean, steps)[:, -1].reshape(n, origins.size)
    actual = hist[:, origins + steps]
    naive = hist[:, origins]
    window_idx = origins[:, None] - np.arange(WINDOW_MEAN_POINTS)[None, :]
    windows = hist[:, window_idx]  # (n, origins, points)
    finite = np.isfinite(windows)
    with np.errstate(invalid="ignore", divide="ignore"):
        wmean = np.where(finite, windows, 0.0).sum(axis=2) / finite.sum(axis=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return (
            np.nanmean(np.abs(model - actual), axis=1),
            np.nanmean(np.abs(naive - actual), axis=1),
            np.nanmean(np.abs(wmean - actual), axis=1),
        )


def forecast_series(
    series: Sequence[Series | None],
    cfg: ForecastConfig,
    now: float,
    engine: ForecastEngine | None = None,
    clip: tuple[float, float | None] = (0.0, None),
) -> list[Signal]:
    """Forecast each series `cfg.horizon` ahead of `now`, or say why not."""
    engine = engine or make_engine(cfg)
    steps = max(1, round(cfg.horizon / cfg.fit_step))
    signals: list[Signal | None] = [None] * len(series)
    rows: list[FloatArray] = []
    index: list[int] = []
    for i, s in enumerate(series):
        last = s.last_sample_time() if s is not None else None
        if s is None or last is None:
            signals[i] = Signal(last, None, "no samples in the window")
            continue
        observed = float(np.isfinite(s.values).sum()) * s.step
        if observed < cfg.min_history:
            signals[i] = Signal(
                last,
                None,
                f"only {observed:.0f}s of samples in the window, "
                f"forecast needs {cfg.min_history:.0f}s",
            )
            continue
        rows.append(bucket(s, cfg.fit_step, now).values)
        index.append(i)
    if rows:
        width = max(len(r) for r in rows)
        hist = np.full((len(rows), width), np.nan)
        for r, row in enumerate(rows):
            hist[r, width - len(row) :] = row
        fitted: Fitted | None = None
        if isinstance(engine, LeastSquaresArima):
            fitted = engine.fit(hist)
            paths = engine.predict(fitted, hist, steps, cfg.interval_level)
        else:
            paths = engine.forecast(hist, steps, cfg.interval_level)
        chosen = _choose_methods(engine, fitted, hist, steps, paths)
        last_values = last_finite(hist)
        lo_clip, hi_clip = clip
        for r, i in enumerate(index):
            s = series[i]
            assert s is not None
            method, reason, mean, lower, upper = chosen[r]
            mean, lower, upper = (np.clip(a, lo_clip, hi_clip) for a in (mean, lower, upper))
            forecast = Forecast(
                origin=now,
                step=cfg.fit_step,
                mean=mean,
                lower=lower,
                upper=upper,
                level=cfg.interval_level,
                method=method,
                reason=reason,
                last_value=float(last_values[r]),
            )
            problem = None if forecast.is_finite() else "forecast is not finite (NaN or Inf)"
            signals[i] = Signal(s.last_sample_time(), forecast, problem)
    return [s for s in signals if s is not None]


_Choice = tuple[str, str, FloatArray, FloatArray, FloatArray]


def _choose_methods(
    engine: ForecastEngine,
    fitted: Fitted | None,
    hist: FloatArray,
    steps: int,
    paths: PathBatch,
) -> list[_Choice]:
    """Per series: the model's path, unless a baseline was more accurate at the horizon on
    the series' own recent history; then the baseline's level with the model's interval
    width, and a reason saying so."""
    n = hist.shape[0]
    choices: list[_Choice] = [
        (engine.name, f"{engine.name} fit", paths.mean[r], paths.lower[r], paths.upper[r])
        for r in range(n)
    ]
    if not isinstance(engine, LeastSquaresArima) or fitted is None or hist.shape[1] < 3 * steps:
        return choices
    model_mae, naive_mae, window_mae = _in_window_errors(engine, fitted, hist, steps)
    naive = last_finite(hist)
    window = _nanmean_rows(hist[:, -WINDOW_MEAN_POINTS:])
    for r in range(n):
        scores = {"model": model_mae[r], "last_value": naive_mae[r], "window_mean": window_mae[r]}
        if not all(np.isfinite(v) for v in scores.values()):
            continue
        best = min(scores, key=lambda k: scores[k])
        if best == "model":
            choices[r] = (
                engine.name,
                f"{engine.name}: recent error {model_mae[r]:.2f} beats last value "
                f"{naive_mae[r]:.2f} and window mean {window_mae[r]:.2f}",
                *choices[r][2:],
            )
            continue
        level = naive[r] if best == "last_value" else window[r]
        flat = np.full(steps, level)
        half = paths.upper[r] - paths.mean[r]
        choices[r] = (
            best,
            f"{best}: recent error {scores[best]:.2f} beats {engine.name} {model_mae[r]:.2f}",
            flat,
            flat - half,
            flat + half,
        )
    return choices
