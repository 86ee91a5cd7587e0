"""Forecasting: series in, forecasts with intervals and a peak out. Pure computation.

- `engines`: ARIMA(p, d, 0) by batched least squares (production) and statsmodels'
  ARIMA (reference), bucketing, and the stability rule every fit must pass;
- `ensemble`: members scored on each series' own recent history, weighted by evidence;
- `intervals`: split-conformal intervals with an adaptive correction carried across
  ticks per series, and the peak's offset;
- `leading`: a workload's demand (request rate, queue) forecast and mapped to GPU load by
  a fitted per-workload ratio, used when it has been the more accurate signal.

`forecast_series` puts them together: per series the ensemble (or the last value when it
has clearly been better), its conformal interval, its peak, and a reason naming every
member dropped and why. An unstable or runaway fit never reaches a decision.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast.engines import (
    Fitted,
    ForecastEngine,
    LeastSquaresArima,
    PathBatch,
    StatsmodelsArima,
    bucket,
    bucket_rows,
    inverse_root_modulus,
    last_finite,
    make_engine,
    refit_or_reuse,
    stable_fit,
    within_band,
    z_score,
)
from gpuscaler.core.forecast.ensemble import (
    ASSESS_CHUNK,
    ASSESS_ORIGINS,
    FALLBACK_MARGIN,
    MEMBERS,
    SES_ALPHAS,
    WINDOW_MEAN_POINTS,
    Assessment,
    assess,
    choose_method,
)
from gpuscaler.core.forecast.intervals import (
    coverage_note,
    issue,
    naive_half_width,
    resolve,
)
from gpuscaler.core.forecast.leading import LEAD_MARGIN, Ratio, fit_ratio, lead
from gpuscaler.core.forecast.scored import clipped, half_widths, live_paths, refresh, score
from gpuscaler.core.model import (
    BoolArray,
    FitState,
    FloatArray,
    Forecast,
    IntervalState,
    Scored,
    Series,
    Signal,
)

__all__ = [
    "ASSESS_ORIGINS",
    "FALLBACK_MARGIN",
    "LEAD_MARGIN",
    "SES_ALPHAS",
    "WINDOW_MEAN_POINTS",
    "Assessment",
    "Fitted",
    "ForecastEngine",
    "LeastSquaresArima",
    "PathBatch",
    "Ratio",
    "StatsmodelsArima",
    "assess",
    "bucket",
    "choose_method",
    "fit_ratio",
    "forecast_series",
    "last_finite",
    "lead",
    "make_engine",
    "refit_or_reuse",
    "z_score",
]


def _admit(s: Series | None, cfg: ForecastConfig) -> Signal | None:
    """Why `s` cannot be forecast (a Signal without forecast), or None when it can."""
    last = s.last_sample_time() if s is not None else None
    if s is None or last is None:
        return Signal(last, None, "no samples in the window")
    if s.step > cfg.fit_step + 1e-9:
        return Signal(
            last,
            None,
            f"samples every {s.step:g}s are coarser than forecast.fit_step {cfg.fit_step:g}s",
        )
    observed = float(np.isfinite(s.values).sum()) * s.step
    if observed < cfg.min_history:
        return Signal(
            last,
            None,
            f"only {observed:.0f}s of samples in the window, forecast needs {cfg.min_history:.0f}s",
        )
    return None


def forecast_series(
    series: Sequence[Series | None],
    cfg: ForecastConfig,
    now: float,
    engine: ForecastEngine | None = None,
    clip: tuple[float, float | None] = (0.0, None),
    keys: Sequence[str | None] | None = None,
    prior: Mapping[str, FitState] | None = None,
    states: dict[str, FitState] | None = None,
    rescore: bool = False,
) -> list[Signal]:
    """Forecast each series `cfg.horizon` ahead of `now`, or say why not.

    With `keys`, each series' fitted coefficients are taken from `prior` while younger than
    `cfg.refit_every`, and so is its ensemble scoring (weights, recent errors, conformal
    errors, peak offset; `rescore` scores it again at every call, the cost before issue
    18); its adaptive interval state is carried on, and the states to keep for the next
    call are put in `states`."""
    signals: list[Signal | None] = [_admit(s, cfg) for s in series]
    index = [i for i, s in enumerate(signals) if s is None]
    if index:
        hist = bucket_rows([s for i in index if (s := series[i]) is not None], cfg.fit_step, now)
        batch = _Batch(
            engine or make_engine(cfg),
            hist,
            max(1, round(cfg.horizon / cfg.fit_step)),
            cfg,
            now,
            [keys[i] for i in index] if keys is not None else [None] * len(index),
            prior or {},
            states if states is not None else {},
            clip,
            rescore,
        )
        for i, f in zip(index, _forecast_batch(batch), strict=True):
            s = series[i]
            assert s is not None
            problem = None if f.is_finite() else "forecast is not finite (NaN or Inf)"
            signals[i] = Signal(s.last_sample_time(), f, problem)
    return [s for s in signals if s is not None]


@dataclass(frozen=True, eq=False)
class _Batch:
    engine: ForecastEngine
    hist: FloatArray
    steps: int
    cfg: ForecastConfig
    now: float
    keys: Sequence[str | None]
    prior: Mapping[str, FitState]
    states: dict[str, FitState]
    clip: tuple[float, float | None]
    rescore: bool = False


@dataclass(frozen=True, eq=False)
class _Model:
    """The engine's paths and which rows may be used, with why not."""

    paths: PathBatch
    fitted: Fitted | None
    usable: BoolArray
    dropped: list[str | None]


def _model(b: _Batch) -> _Model:
    """Fit (or reuse) and forecast with the engine; drop every row whose fit is unstable
    or whose path leaves the window's band."""
    n = b.hist.shape[0]
    fitted: Fitted | None = None
    level = b.cfg.interval_level
    stable: BoolArray
    modulus: FloatArray
    if isinstance(b.engine, LeastSquaresArima):
        fitted, new_states, _ = refit_or_reuse(
            b.engine, b.hist, b.keys, b.prior, b.now, b.cfg.refit_every
        )
        b.states.update(new_states)
        paths = b.engine.predict(fitted, b.hist, b.steps, level)
        stable = stable_fit(fitted)
        modulus = inverse_root_modulus(fitted.phi)
    else:
        paths = b.engine.forecast(b.hist, b.steps, level)
        stable, modulus = np.ones(n, dtype=bool), np.zeros(n)
    finite: BoolArray = np.asarray(np.isfinite(paths.mean).all(axis=1))
    banded = within_band(paths.mean, b.hist)
    name = b.engine.name
    dropped: list[str | None] = []
    for r in range(n):
        if not finite[r]:
            dropped.append(f"{name} dropped: no fit")
        elif not stable[r]:
            dropped.append(
                f"{name} dropped: unstable fit (a characteristic root inside or near the unit "
                f"circle, inverse root modulus {modulus[r]:.3f})"
            )
        elif not banded[r]:
            dropped.append(f"{name} dropped: its path leaves the window's range")
        else:
            dropped.append(None)
    return _Model(paths, fitted, finite & stable & banded, dropped)


def _forecast_batch(b: _Batch) -> list[Forecast]:
    """The evidence-weighted ensemble, unless the last value has clearly been more
    accurate on the series' recent history; the engine's path alone when there is too
    little history to assess (and the last value when that path was dropped)."""
    model = _model(b)
    scored: list[Scored | None] = [None] * b.hist.shape[0]
    if model.fitted is not None and b.cfg.ensemble:
        scored = _scoring(b, model)
    adaptive = [_adaptive(b, r, key) for r, key in enumerate(b.keys)]
    out = _assessed(b, model, scored, adaptive)
    out = clipped(out, b.clip)
    for r, key in enumerate(b.keys):
        state = adaptive[r]
        if key is not None and state is not None and key in b.states:
            interval = issue(state, out[r].lower, out[r].upper, b.cfg.fit_step)
            b.states[key] = replace(b.states[key], interval=interval)
    return out


def _scoring(b: _Batch, model: _Model) -> list[Scored | None]:
    """Each row's ensemble scoring: kept from the previous tick while its coefficients
    are (the state reused as is), made afresh for the rows refitted now, without a key
    or with `rescore`; None where there is too little history to score."""
    assert isinstance(b.engine, LeastSquaresArima) and model.fitted is not None
    out: list[Scored | None] = [
        None if b.rescore or key is None else _kept(b, key) for key in b.keys
    ]
    _refreshed(b, model, out)
    todo = [r for r, s in enumerate(out) if s is None]
    fresh: list[Scored | None] = []
    for i in range(0, len(todo), ASSESS_CHUNK):  # chunks bound the temporaries
        rows = todo[i : i + ASSESS_CHUNK]
        f = model.fitted
        part = Fitted(f.intercept[rows], f.phi[rows], f.sigma2[rows])
        a = assess(
            b.engine, part, b.hist[rows], b.steps, model.paths.mean[rows], model.usable[rows]
        )
        newest = b.now - b.steps * b.cfg.fit_step
        fresh += score(a, newest) if a is not None else [None] * len(rows)
    for r, sc in zip(todo, fresh, strict=True):
        out[r] = sc
        _keep(b, r, sc)
    return out


def _refreshed(b: _Batch, model: _Model, out: list[Scored | None]) -> None:
    """The kept scorings in `out` (and on the states) with the errors at the origins
    completed since they were made."""
    assert isinstance(b.engine, LeastSquaresArima) and model.fitted is not None
    kept = [r for r, s in enumerate(out) if s is not None]
    if not kept:
        return
    f, rows = model.fitted, np.array(kept)
    part = Fitted(f.intercept[rows], f.phi[rows], f.sigma2[rows])
    old = [s for s in (out[r] for r in kept) if s is not None]
    new = refresh(b.engine, part, b.hist[rows], old, model.usable[rows], b.now, b.cfg.fit_step)
    for r, sc in zip(kept, new, strict=True):
        _keep(b, r, sc)
        out[r] = sc


def _keep(b: _Batch, r: int, sc: Scored | None) -> None:
    """Put row `r`'s scoring on its state (a row with a key)."""
    key = b.keys[r]
    if sc is not None and key is not None and key in b.states and b.states[key].scored is not sc:
        b.states[key] = replace(b.states[key], scored=sc)


def _kept(b: _Batch, key: str) -> Scored | None:
    """The scoring kept on the series' state, if its coefficients were not refitted now."""
    state = b.states.get(key)
    if state is None or key not in b.prior or state is not b.prior[key]:
        return None
    if state.scored is not None and state.scored.abs_errors.shape[1] != b.steps:
        return None  # scored for another horizon (the config changed): score again
    return state.scored


def _adaptive(b: _Batch, r: int, key: str | None) -> IntervalState | None:
    """The series' adaptive interval state after checking what was observed since the
    previous tick (None for a series without a kept state)."""
    if key is None or key not in b.states:
        return None
    prior = b.prior[key].interval if key in b.prior else None
    return resolve(prior, b.hist[r], b.now, b.cfg.fit_step, b.cfg.interval_level)


def _plain(b: _Batch, model: _Model, r: int) -> Forecast:
    """The engine's own path and interval, or the last value when the path was dropped."""
    last = float(last_finite(b.hist[r : r + 1])[0])
    name = b.engine.name
    if model.usable[r]:
        mean, lower, upper = (
            a[r] for a in (model.paths.mean, model.paths.lower, model.paths.upper)
        )
        reason = f"{name} fit" + ("" if not b.cfg.ensemble else ", too little history to assess")
        method = name
    else:
        half = naive_half_width(b.hist[r : r + 1], b.steps, b.cfg.interval_level)[0]
        mean = np.full(b.steps, last)
        lower, upper = mean - half, mean + half
        reason, method = f"last value: {model.dropped[r]}", "last_value"
    return _forecast(b, mean, lower, upper, method, reason, last)


def _forecast(
    b: _Batch,
    mean: FloatArray,
    lower: FloatArray,
    upper: FloatArray,
    method: str,
    reason: str,
    last: float,
    errors: Mapping[str, float] | None = None,
    peak_error: float = 0.0,
) -> Forecast:
    return Forecast(
        origin=b.now,
        step=b.cfg.fit_step,
        mean=mean,
        lower=np.minimum(lower, mean),
        upper=np.maximum(upper, mean),
        level=b.cfg.interval_level,
        method=method,
        reason=reason,
        last_value=last,
        errors=errors or {},
        peak_error=peak_error,
    )


def _assessed(
    b: _Batch,
    model: _Model,
    scored: Sequence[Scored | None],
    adaptive: Sequence[IntervalState | None],
) -> list[Forecast]:
    """Every row's forecast: from its scoring (the kept weights on the members' live
    paths, the conformal interval at the row's adaptive level), or the engine's path."""
    out: list[Forecast | None] = [None] * b.hist.shape[0]
    rows = [r for r, s in enumerate(scored) if s is not None and s.method is not None]
    if rows:
        kept = [s for s in (scored[r] for r in rows) if s is not None]
        live, weights = live_paths(
            b.hist[rows], kept, model.paths.mean[rows], model.usable[rows], b.steps
        )
        nominal = b.cfg.interval_level
        levels = np.array([_level(adaptive[r], nominal) for r in rows])
        halves = half_widths(kept, levels)
        for i, (r, sc) in enumerate(zip(rows, kept, strict=True)):
            out[r] = _from_scored(b, model, r, sc, live, weights, i, halves[i], adaptive[r])
    return [f if f is not None else _plain(b, model, r) for r, f in enumerate(out)]


def _level(state: IntervalState | None, nominal: float) -> float:
    return state.level if state is not None else nominal


def _from_scored(
    b: _Batch,
    model: _Model,
    r: int,
    sc: Scored,
    live: Mapping[str, FloatArray],
    weights: Mapping[str, FloatArray],
    i: int,
    half: FloatArray,
    adaptive: IntervalState | None,
) -> Forecast:
    assert sc.method is not None
    mean = live[sc.method][i]
    if not np.all(np.isfinite(half)):
        half = _fallback_half(b, model, r)
    row_weights = {m: float(w[i]) for m, w in weights.items()}
    reason = (
        _reason(b, model, row_weights, SES_ALPHAS[sc.ses_best], r, sc.method, sc.errors)
        + "; "
        + coverage_note(adaptive, b.cfg.interval_level)
    )
    last = float(live["last_value"][i, 0])
    return _forecast(b, mean, mean - half, mean + half, sc.method, reason, last, sc.errors, sc.peak)


def _fallback_half(b: _Batch, model: _Model, r: int) -> FloatArray:
    """Half width when too few recent errors: the model's, or the last value's."""
    if model.usable[r]:
        out: FloatArray = model.paths.upper[r] - model.paths.mean[r]
    else:
        out = naive_half_width(b.hist[r : r + 1], b.steps, b.cfg.interval_level)[0]
    return out


_LABELS = {
    "arima": "",
    "ses": "smoothing",
    "ses_avg": "averaged smoothing",
    "window_mean": "window mean",
}


def _reason(
    b: _Batch,
    model: _Model,
    member_weights: Mapping[str, float],
    alpha: float,
    r: int,
    method: str,
    errors: Mapping[str, float],
) -> str:
    name = b.engine.name
    label = {**_LABELS, "arima": name}
    weights = ", ".join(f"{label[m]} {member_weights[m]:.2f}" for m in MEMBERS)
    arima = f"{errors['arima']:.2f}" if "arima" in errors else "-"
    ens = f"{errors['ensemble']:.2f}" if "ensemble" in errors else "-"
    scores = (
        f"recent error {ens} vs last value {errors['last_value']:.2f}, "
        f"window mean {errors.get('window_mean', np.nan):.2f}, {name} {arima}"
    )
    dropped = f"; {model.dropped[r]}" if model.dropped[r] else ""
    if method == "ensemble":
        return (
            f"ensemble weighted by recent error ({weights}; smoothing alpha "
            f"{alpha:.2f}): {scores}{dropped}"
        )
    return (
        f"last_value: beats the ensemble ({ens}) by over {FALLBACK_MARGIN:.0%} on recent "
        f"data; {scores}{dropped}"
    )
