"""The forecast phase as it was before its per-tick work was batched across series
(commit fcec3cc, issue 18): the oracle of tests/test_forecast_batched.py. Each series'
adaptive interval was resolved and issued on its own, each forecast assembled, clipped and
checked for finiteness on its own, and the stability of reused coefficients found again
at every tick. Copied as it was (only the imports changed)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from itertools import chain
from operator import attrgetter

import numpy as np
from scored_reference import _reason, _scoring, half_widths, live_paths

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast.assembly import Batch, Model
from gpuscaler.core.forecast.engines import (
    Fitted,
    ForecastEngine,
    LeastSquaresArima,
    bucket_rows,
    inverse_root_modulus,
    last_finite,
    make_engine,
    stable_fit,
    within_band,
)
from gpuscaler.core.forecast.ensemble import (
    SES_ALPHAS,
)
from gpuscaler.core.forecast.intervals import (
    ACI_GAMMA,
    ACI_LEVELS,
    coverage_note,
    naive_half_width,
)
from gpuscaler.core.model import (
    BoolArray,
    FitState,
    FloatArray,
    Forecast,
    IntervalState,
    IssuedInterval,
    Scored,
    Series,
    Signal,
)


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
                FitState(
                    now,
                    float(intercept[r]),
                    tuple(phi[r].tolist()),
                    float(sigma2[r]),
                    prior[key].interval if key in prior else None,
                )
                if r in stale_set
                else prior[key]
            )
    return Fitted(intercept, phi, sigma2), states, len(stale)


def resolve(
    state: IntervalState | None, row: FloatArray, now: float, step: float, nominal: float
) -> IntervalState:
    """The adaptive state after checking every point observed since `state.checked_at`
    against the intervals issued before; `row` is the bucketed window ending at `now`.
    The result's `checked_at` is `now`; its pending intervals are those not yet fully
    observed. The pending intervals of one length are checked at once (one array each),
    not one by one: a tick holds about a horizon's worth of them per series."""
    if state is None:
        return IntervalState(level=nominal, checked_at=now)
    points = misses = 0
    keep: tuple[IssuedInterval, ...] = ()
    if state.pending:
        points, misses, keep = _check_pending(state, row, now, step)
    level = state.level
    if points:
        level += ACI_GAMMA * (misses / points - (1.0 - nominal))
        level = min(max(level, ACI_LEVELS[0]), ACI_LEVELS[1])
    return IntervalState(level, now, keep, state.points + points, state.misses + misses)


_LOWER, _UPPER = attrgetter("lower"), attrgetter("upper")
_ORIGIN, _STEP = attrgetter("origin"), attrgetter("step")


def _check_pending(
    state: IntervalState, row: FloatArray, now: float, step: float
) -> tuple[int, int, tuple[IssuedInterval, ...]]:
    """(points observed since `state.checked_at`, of which outside their interval, the
    intervals still pending): every pending interval's buckets checked in one pass
    (issue 18; one interval at a time cost about 0.5 ms per series and tick)."""
    pending = state.pending
    n = len(pending)
    sizes = np.fromiter(map(len, map(_LOWER, pending)), np.int64, n)
    total = int(sizes.sum())
    origin = np.repeat(np.fromiter(map(_ORIGIN, pending), np.float64, n), sizes)
    spacing = np.repeat(np.fromiter(map(_STEP, pending), np.float64, n), sizes)
    # 1, 2, ..., size within each interval: the bucket ends origin + step * k
    k = np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes) + 1
    taus = origin + spacing * k.astype(np.float64)
    lower = np.fromiter(chain.from_iterable(map(_LOWER, pending)), np.float64, total)
    upper = np.fromiter(chain.from_iterable(map(_UPPER, pending)), np.float64, total)
    new = (taus > state.checked_at + 1e-9) & (taus <= now + 1e-9)
    idx = len(row) - 1 - np.round((now - taus[new]) / step).astype(np.int64)
    inside = idx >= 0
    y = row[idx[inside]]
    lo, hi = lower[new][inside], upper[new][inside]
    seen = np.isfinite(y)
    # an interval's last bucket ends at origin + step * size; an empty one has none
    ends = [p.origin + p.step * float(len(p.lower)) if p.lower else -math.inf for p in pending]
    keep = tuple(p for p, t in zip(pending, ends, strict=True) if t > now + 1e-9)
    return int(seen.sum()), int(((y < lo) | (y > hi))[seen].sum()), keep


def issue(state: IntervalState, lower: FloatArray, upper: FloatArray, step: float) -> IntervalState:
    """`state` with the interval issued now (at `state.checked_at`) pending."""
    issued = IssuedInterval(state.checked_at, step, tuple(lower.tolist()), tuple(upper.tolist()))
    return IntervalState(
        state.level, state.checked_at, (*state.pending, issued), state.points, state.misses
    )


def clipped(fs: Sequence[Forecast], clip: tuple[float, float | None]) -> list[Forecast]:
    """Each forecast with its path, interval and peak inside `clip` (all rows at once)."""
    if not fs:
        return []
    lo, hi = clip
    raw = np.stack([f.mean for f in fs])
    mean, lower, upper = (
        np.clip(a, lo, hi)
        for a in (raw, np.stack([f.lower for f in fs]), np.stack([f.upper for f in fs]))
    )
    offset = np.array([f.peak_error for f in fs])
    peak = np.clip(raw.max(axis=1) + offset, lo, hi)
    peak_error = np.where(np.isfinite(peak), peak - mean.max(axis=1), offset)
    return [
        replace(f, mean=mean[r], lower=lower[r], upper=upper[r], peak_error=float(peak_error[r]))
        for r, f in enumerate(fs)
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
        batch = Batch(
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


def _model(b: Batch) -> Model:
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
    return Model(paths, fitted, finite & stable & banded, dropped)


def _forecast_batch(b: Batch) -> list[Forecast]:
    """The evidence-weighted ensemble, unless the last value has clearly been more
    accurate on the series' recent history; the engine's path alone when there is too
    little history to assess (and the last value when that path was dropped)."""
    model = _model(b)
    scored: list[Scored | None] = [None] * b.hist.shape[0]
    if model.fitted is not None and b.cfg.ensemble:
        scored = _scoring(b, model)
        for r, sc in enumerate(scored):  # the scorings on the states (`_scoring` did it)
            key = b.keys[r]
            ok = sc is not None and key is not None and key in b.states
            if ok and key is not None and b.states[key].scored is not sc:
                b.states[key] = replace(b.states[key], scored=sc)
    adaptive = [_adaptive(b, r, key) for r, key in enumerate(b.keys)]
    out = _assessed(b, model, scored, adaptive)
    out = clipped(out, b.clip)
    for r, key in enumerate(b.keys):
        state = adaptive[r]
        if key is not None and state is not None and key in b.states:
            interval = issue(state, out[r].lower, out[r].upper, b.cfg.fit_step)
            b.states[key] = replace(b.states[key], interval=interval)
    return out


def _adaptive(b: Batch, r: int, key: str | None) -> IntervalState | None:
    """The series' adaptive interval state after checking what was observed since the
    previous tick (None for a series without a kept state)."""
    if key is None or key not in b.states:
        return None
    prior = b.prior[key].interval if key in b.prior else None
    return resolve(prior, b.hist[r], b.now, b.cfg.fit_step, b.cfg.interval_level)


def _plain(b: Batch, model: Model, r: int) -> Forecast:
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
    b: Batch,
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
    b: Batch,
    model: Model,
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


def _fallback_half(b: Batch, model: Model, r: int) -> FloatArray:
    """Half width when too few recent errors: the model's, or the last value's (one row;
    gpuscaler's assembly.py before commit fc4 batched it)."""
    if model.usable[r]:
        out: FloatArray = model.paths.upper[r] - model.paths.mean[r]
    else:
        out = naive_half_width(b.hist[r : r + 1], b.steps, b.cfg.interval_level)[0]
    return out


def _from_scored(
    b: Batch,
    model: Model,
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
