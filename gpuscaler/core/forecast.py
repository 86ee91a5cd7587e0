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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from statistics import NormalDist
from typing import Protocol

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from gpuscaler.config import ForecastConfig
from gpuscaler.core.model import FitState, FloatArray, Forecast, IntArray, Series, Signal

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


def refit_or_reuse(
    engine: LeastSquaresArima,
    hist: FloatArray,
    keys: Sequence[str | None],
    prior: Mapping[str, FitState],
    now: float,
    refit_every: float,
) -> tuple[Fitted, dict[str, FitState], int]:
    """Coefficients for every row: reused where the series' fit is younger than
    `refit_every` (its state, the newest observations, still moves the forecast), refitted
    in one batch otherwise. Returns them, the fit states to keep, and how many were refit."""
    n = hist.shape[0]
    stale = [
        r
        for r, key in enumerate(keys)
        if key is None
        or key not in prior
        or now - prior[key].fitted_at >= refit_every
        or len(prior[key].phi) != engine.p
    ]
    intercept, phi, sigma2 = np.empty(n), np.empty((n, engine.p)), np.empty(n)
    if stale:
        fresh = engine.fit(hist[stale])
        intercept[stale], phi[stale], sigma2[stale] = fresh.intercept, fresh.phi, fresh.sigma2
    states: dict[str, FitState] = {}
    stale_set = set(stale)
    for r, key in enumerate(keys):
        if r not in stale_set:
            assert key is not None
            old = prior[key]
            intercept[r], phi[r], sigma2[r] = old.intercept, old.phi, old.sigma2
        if key is not None:
            states[key] = (
                FitState(now, float(intercept[r]), tuple(phi[r].tolist()), float(sigma2[r]))
                if r in stale_set
                else prior[key]
            )
    return Fitted(intercept, phi, sigma2), states, len(stale)


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


# --------------------------------------------------------------------------- ensemble

ASSESS_ORIGINS = 36
"""In-window origins every candidate is scored on: enough for a stable mean error and
interval quantiles, few enough to cost less than the fit."""
WINDOW_MEAN_POINTS = 12
"""The window-mean baseline averages the last 12 buckets (2 min at 10 s)."""
SES_ALPHAS = np.array([0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0])
"""Smoothing weights searched for simple exponential smoothing, per series: denser where
the Azure traces' best weights lie (0.15-0.3 at 1 min)."""
FALLBACK_MARGIN = 0.10
"""A baseline replaces the ensemble only when its recent error is 10 % lower: measured on
the Azure traces, switching on any smaller lead chases noise and loses accuracy."""
SELECTABLE = ("ensemble", "last_value", "window_mean")
MIN_RESIDUALS = 8
"""Fewer in-window residuals than this: the interval comes from the ARIMA model instead."""


@dataclass(frozen=True, eq=False)
class Assessment:
    """Candidate paths at the live origin and their recent errors, per series."""

    paths: dict[str, FloatArray]  # name -> (n, steps)
    errors: dict[str, FloatArray]  # name -> (n,) in-window MAE over the horizon path
    residuals: dict[str, FloatArray]  # name -> (n, origins, steps): actual - forecast
    alpha: FloatArray  # (n,) chosen SES weight


def _first_finite(a: FloatArray) -> FloatArray:
    return last_finite(a[:, ::-1])


def _ses_levels(hist: FloatArray, positions: IntArray) -> FloatArray:
    """Exponentially smoothed levels (alphas, n, positions) for every weight in SES_ALPHAS,
    level[t] = alpha * y[t] + (1 - alpha) * level[t - 1] from level[0] = y[0], evaluated
    only where needed as one weighted sum per position (a gap takes the previous value)."""
    weights = _ses_weights(hist.shape[1], tuple(int(p) for p in positions))
    levels: FloatArray = np.einsum("nt,apt->anp", _forward_fill(hist), weights)
    return levels


@lru_cache(maxsize=32)
def _ses_weights(t: int, positions: tuple[int, ...]) -> FloatArray:
    """(alphas, positions, t): the weight of sample i in the level at each position. The
    same window shape recurs every tick, so it is computed once."""
    age = np.asarray(positions)[:, None] - np.arange(t)[None, :]
    alphas = SES_ALPHAS[:, None, None]
    weights = np.where(age >= 0, alphas * (1 - alphas) ** np.maximum(age, 0), 0.0)
    weights[:, :, 0] = np.where(age[:, 0] >= 0, (1 - alphas[:, :, 0]) ** age[:, 0], 0.0)
    weights.flags.writeable = False
    return weights


def _mean_abs(resid: FloatArray) -> FloatArray:
    """Mean absolute value per row of (n, origins, steps), ignoring NaN (NaN if none)."""
    finite = np.isfinite(resid)
    total = np.abs(np.where(finite, resid, 0.0)).sum(axis=(1, 2))
    count = finite.sum(axis=(1, 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        out: FloatArray = np.where(count > 0, total / count, np.nan)
    return out


def _forward_fill(a: FloatArray) -> FloatArray:
    """Each gap takes the last finite value before it (the first finite one at the start)."""
    finite = np.isfinite(a)
    idx = np.where(finite, np.arange(a.shape[1])[None, :], 0)
    np.maximum.accumulate(idx, axis=1, out=idx)
    out: FloatArray = a[np.arange(a.shape[0])[:, None], idx]
    return np.where(np.isfinite(out), out, _first_finite(a)[:, None])


def _nanquantile_origins(resid: FloatArray, q: float) -> FloatArray:
    """Quantile `q` over the origins axis of (n, origins, steps), ignoring NaN (which
    sorts last): (n, steps), NaN where a step has no finite residual."""
    ordered = np.sort(resid, axis=1)
    count = np.isfinite(resid).sum(axis=1)  # (n, steps)
    top = np.maximum(count - 1, 0)
    pos = q * top
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, top)
    frac = pos - lo
    low_v = np.take_along_axis(ordered, lo[:, None, :], axis=1)[:, 0, :]
    high_v = np.take_along_axis(ordered, hi[:, None, :], axis=1)[:, 0, :]
    out: FloatArray = np.where(count > 0, low_v * (1 - frac) + high_v * frac, np.nan)
    return out


def assess(
    engine: LeastSquaresArima, fitted: Fitted, hist: FloatArray, steps: int
) -> Assessment | None:
    """Score ARIMA, exponential smoothing, the window mean, the last value and their
    ensemble on the series' own recent history: at in-window origins whose next `steps`
    points are known, each forecasts the horizon path; errors are averaged over it.

    ARIMA is scored with the coefficients fitted on the whole window (a slight in-sample
    advantage; refitting at each origin would cost a fit per origin)."""
    n, t = hist.shape
    p, d = engine.p, engine.d
    spacing = max(1, steps // 6)
    lowest = max(p + d + 2, WINDOW_MEAN_POINTS)
    origins = np.arange(t - steps - 1, lowest - 1, -spacing)[:ASSESS_ORIGINS][::-1]
    if origins.size < 4:
        return None
    future = hist[:, origins[:, None] + 1 + np.arange(steps)[None, :]]  # (n, O, steps)
    # ARIMA, rolled from every origin of every series at once.
    z = np.diff(hist, n=d, axis=1) if d else hist
    lag_idx = (origins[:, None] - d) - np.arange(p)[None, :]
    lags = z[:, lag_idx].reshape(n * origins.size, p)
    rep = Fitted(
        intercept=np.repeat(fitted.intercept, origins.size),
        phi=np.repeat(fitted.phi, origins.size, axis=0),
        sigma2=np.repeat(fitted.sigma2, origins.size),
    )
    zmean = np.repeat(_nanmean_rows(z), origins.size)
    last_at = hist[:, origins].reshape(-1)
    arima_in = engine.roll(rep, lags, last_at, zmean, steps).reshape(n, origins.size, steps)
    # Exponential smoothing: the weight with the least in-window error, per series.
    levels = _ses_levels(hist, np.append(origins, t - 1))  # (A, n, O + 1)
    ses_err = np.empty((len(SES_ALPHAS), n))
    for k in range(len(SES_ALPHAS)):  # one weight at a time bounds the temporary to (n, O, steps)
        ses_err[k] = _mean_abs(future - levels[k, :, :-1, None])
    ses_err = np.where(np.isfinite(ses_err), ses_err, np.inf)
    best = np.argmin(ses_err, axis=0)
    rows = np.arange(n)
    ses_in = levels[best, rows, :-1]  # (n, O)
    window_idx = origins[:, None] - np.arange(WINDOW_MEAN_POINTS)[None, :]
    windows = hist[:, window_idx]
    finite = np.isfinite(windows)
    with np.errstate(invalid="ignore", divide="ignore"):
        wmean_in = np.where(finite, windows, 0.0).sum(axis=2) / finite.sum(axis=2)
    naive_in = hist[:, origins]
    flat = {"ses": ses_in, "window_mean": wmean_in, "last_value": naive_in}
    in_window: dict[str, FloatArray] = {"arima": arima_in}
    in_window.update({k: np.repeat(v[..., None], steps, axis=2) for k, v in flat.items()})
    in_window["ensemble"] = (arima_in + in_window["ses"] + in_window["window_mean"]) / 3
    # The same candidates at the live origin (the end of the window).
    arima_live = engine.predict_mean(fitted, hist, steps)
    live_flat = {
        "ses": levels[best, rows, -1],
        "window_mean": _nanmean_rows(hist[:, -WINDOW_MEAN_POINTS:]),
        "last_value": last_finite(hist),
    }
    paths: dict[str, FloatArray] = {"arima": arima_live}
    paths.update({k: np.repeat(v[:, None], steps, axis=1) for k, v in live_flat.items()})
    paths["ensemble"] = (arima_live + paths["ses"] + paths["window_mean"]) / 3
    errors: dict[str, FloatArray] = {}
    residuals: dict[str, FloatArray] = {}
    for name, path in in_window.items():
        resid = future - path
        errors[name] = _mean_abs(resid)
        if name in SELECTABLE:  # only a forecast that can be chosen needs its interval
            residuals[name] = resid
    return Assessment(paths, errors, residuals, SES_ALPHAS[best])


def forecast_series(
    series: Sequence[Series | None],
    cfg: ForecastConfig,
    now: float,
    engine: ForecastEngine | None = None,
    clip: tuple[float, float | None] = (0.0, None),
    keys: Sequence[str | None] | None = None,
    prior: Mapping[str, FitState] | None = None,
    states: dict[str, FitState] | None = None,
) -> list[Signal]:
    """Forecast each series `cfg.horizon` ahead of `now`, or say why not.

    With `keys`, each series' fitted coefficients are taken from `prior` while younger than
    `cfg.refit_every`, and the fit states to keep for the next call are put in `states`."""
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
        if s.step > cfg.fit_step + 1e-9:
            signals[i] = Signal(
                last,
                None,
                f"samples every {s.step:g}s are coarser than forecast.fit_step {cfg.fit_step:g}s",
            )
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
        row_keys = [keys[i] for i in index] if keys is not None else [None] * len(index)
        forecasts = _forecast_batch(
            engine,
            hist,
            steps,
            cfg,
            now,
            row_keys,
            prior or {},
            states if states is not None else {},
        )
        lo_clip, hi_clip = clip
        for r, i in enumerate(index):
            s = series[i]
            assert s is not None
            f = forecasts[r]
            f = replace(
                f,
                mean=np.clip(f.mean, lo_clip, hi_clip),
                lower=np.clip(f.lower, lo_clip, hi_clip),
                upper=np.clip(f.upper, lo_clip, hi_clip),
            )
            problem = None if f.is_finite() else "forecast is not finite (NaN or Inf)"
            signals[i] = Signal(s.last_sample_time(), f, problem)
    return [s for s in signals if s is not None]


def choose_method(errors: Mapping[str, float]) -> str:
    """The ensemble, unless a baseline's recent error is more than FALLBACK_MARGIN lower."""
    baseline = min(("last_value", "window_mean"), key=lambda k: errors[k])
    if errors[baseline] < errors["ensemble"] * (1 - FALLBACK_MARGIN):
        return baseline
    return "ensemble"


def _forecast_batch(
    engine: ForecastEngine,
    hist: FloatArray,
    steps: int,
    cfg: ForecastConfig,
    now: float,
    keys: Sequence[str | None],
    prior: Mapping[str, FitState],
    states: dict[str, FitState],
) -> list[Forecast]:
    """The ensemble of ARIMA, exponential smoothing and the window mean, unless a baseline
    has been clearly more accurate on the series' recent history; the plain engine when it
    cannot be assessed (statsmodels engine, or too little history)."""
    n = hist.shape[0]
    last_values = last_finite(hist)
    assessment: Assessment | None = None
    if isinstance(engine, LeastSquaresArima):
        fitted, new_states, _ = refit_or_reuse(engine, hist, keys, prior, now, cfg.refit_every)
        states.update(new_states)
        paths = engine.predict(fitted, hist, steps, cfg.interval_level)
        if cfg.ensemble:
            assessment = assess(engine, fitted, hist, steps)
    else:
        paths = engine.forecast(hist, steps, cfg.interval_level)

    def plain(r: int, reason: str) -> Forecast:
        return Forecast(
            origin=now,
            step=cfg.fit_step,
            mean=paths.mean[r],
            lower=paths.lower[r],
            upper=paths.upper[r],
            level=cfg.interval_level,
            method=engine.name,
            reason=reason,
            last_value=float(last_values[r]),
        )

    if assessment is None:
        reason = f"{engine.name} fit" + (
            "" if not cfg.ensemble else ", too little history to assess"
        )
        return [plain(r, reason) for r in range(n)]
    lo_q, hi_q = 0.5 - cfg.interval_level / 2, 0.5 + cfg.interval_level / 2
    names = list(assessment.errors)
    error_table = np.stack([assessment.errors[k] for k in names], axis=1)  # (n, candidates)
    bounds = {
        name: (
            _nanquantile_origins(resid, lo_q),
            _nanquantile_origins(resid, hi_q),
            np.isfinite(resid).sum(axis=1).min(axis=1) >= MIN_RESIDUALS,
        )
        for name, resid in assessment.residuals.items()
    }
    out: list[Forecast] = []
    for r in range(n):
        errors = dict(zip(names, error_table[r].tolist(), strict=True))
        if not np.all(np.isfinite(error_table[r])):
            out.append(plain(r, f"{engine.name} fit, recent errors not computable"))
            continue
        method = choose_method(errors)
        mean = assessment.paths[method][r]
        q_lo, q_hi, enough = bounds[method]
        if enough[r]:
            lower, upper = mean + q_lo[r], mean + q_hi[r]
        else:
            half = paths.upper[r] - paths.mean[r]
            lower, upper = mean - half, mean + half
        scores = (
            f"recent error {errors[method]:.2f} vs last value {errors['last_value']:.2f}, "
            f"window mean {errors['window_mean']:.2f}, {engine.name} {errors['arima']:.2f}"
        )
        if method == "ensemble":
            reason = (
                f"ensemble of {engine.name}, smoothing (alpha {assessment.alpha[r]:.2f}) and "
                f"window mean: {scores}"
            )
        else:
            reason = (
                f"{method}: beats the ensemble ({errors['ensemble']:.2f}) by over "
                f"{FALLBACK_MARGIN:.0%} on recent data; {scores}"
            )
        out.append(
            Forecast(
                origin=now,
                step=cfg.fit_step,
                mean=mean,
                lower=np.minimum(lower, mean),
                upper=np.maximum(upper, mean),
                level=cfg.interval_level,
                method=method,
                reason=reason,
                last_value=float(last_values[r]),
                errors=errors,
            )
        )
    return out
