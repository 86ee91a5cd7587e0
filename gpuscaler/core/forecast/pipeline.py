"""A batch of series forecast together: windows, config, state and `now` in; each series'
forecast (or why there is none) and the new state out.

Per series: ARIMA refitted every `forecast.refit_every`; the ensemble weighted by the
scoring made at the refit (or the last value when clearly better), its split-conformal
interval at the series' adaptive level, and its peak. A series too young to score takes
the model's own path and interval; an unstable fit is never used (the last value instead).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast.arima import (
    Arima,
    Coefficients,
    StatsmodelsArima,
    half_width,
    inverse_root_modulus,
    last_finite,
    stable,
    within_band,
)
from gpuscaler.core.forecast.ensemble import (
    ASSESS_ORIGINS,
    FALLBACK_MARGIN,
    MEMBERS,
    ORIGIN_SPACING,
    Assessment,
    assess,
    choose_method,
    combine,
    errors_at,
    live_members,
    lowest_origin,
    normalized,
)
from gpuscaler.core.forecast.intervals import (
    Adaptive,
    check,
    conformal_half_width,
    coverage_text,
    fresh,
    issue,
    naive_half_width,
    peak_offset,
)
from gpuscaler.core.forecast.members import SES_ALPHAS, bucket_rows, forward_fill, sampled
from gpuscaler.core.forecast.state import (
    CANDIDATES,
    EMPTY,
    METHODS,
    ForecastState,
    Rows,
    Scorings,
    errors_dict,
    gathered,
    take,
)
from gpuscaler.core.model import BoolArray, FloatArray, Forecast, IntArray, Series, Signal

Clip = tuple[float, float | None]
ASSESS_CHUNK = 256
"""Series scored together: bounds the (series, origins, steps) temporaries."""
LABELS = MappingProxyType(
    {"arima": "", "ses": "smoothing", "ses_avg": "averaged smoothing", "window_mean": "window mean"}
)


def forecast(
    series: Sequence[Series | None],
    cfg: ForecastConfig,
    now: float,
    state: ForecastState = EMPTY,
    keys: Sequence[str] | None = None,
    clips: Sequence[Clip] | None = None,
) -> tuple[list[Signal], ForecastState]:
    """Forecast each series `cfg.horizon` ahead of `now`, or say why not; with `keys`,
    each series' state is read from `state` and the new state of those series returned.
    `clips`: each series' bounds (low, high or None), (0, None) by default."""
    last, observed = sampled(series)
    signals: list[Signal | None] = [
        _refused(s, cfg, t, seen) for s, t, seen in zip(series, last, observed, strict=True)
    ]
    index = [i for i, s in enumerate(signals) if s is None]
    if not index:
        return [s for s in signals if s is not None], EMPTY
    rows = [s for i in index if (s := series[i]) is not None]
    names = tuple(keys[i] for i in index) if keys is not None else tuple(map(str, index))
    steps = max(1, round(cfg.horizon / cfg.fit_step))
    prior, found = gathered(state, names, lambda new: _fresh(new, cfg, steps))
    # an overflowing series (huge values) is flagged below, not warned about
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        hist = bucket_rows(rows, cfg.fit_step, now)
        bounds = [clips[i] if clips is not None else (0.0, None) for i in index]
        batch = _Batch(cfg, now, hist, forward_fill(hist), steps, prior, found, bounds)
        forecasts, finite, after = _forecast(batch)
    for i, f, ok in zip(index, forecasts, finite, strict=True):
        signals[i] = Signal(last[i], f, None if ok else "forecast is not finite (NaN or Inf)")
    out = ForecastState((after,)) if keys is not None else EMPTY
    return [s for s in signals if s is not None], out


def _fresh(keys: tuple[str, ...], cfg: ForecastConfig, steps: int) -> Rows:
    """Rows of series never seen: nothing fitted, scored or issued."""
    n, p = len(keys), cfg.order[0]
    nan = np.full(n, np.nan)
    return Rows(
        keys,
        nan.copy(),
        Coefficients(nan.copy(), np.full((n, p), np.nan), nan.copy()),
        nan.copy(),
        np.full((n, steps), np.nan),
        Scorings(
            np.zeros(n, dtype=bool),
            np.zeros(n, dtype=np.int64),
            np.zeros((n, len(MEMBERS))),
            np.full((n, len(CANDIDATES)), np.nan),
            np.zeros(n, dtype=np.int64),
            np.ones((n, len(SES_ALPHAS))),
            np.full((n, steps, ASSESS_ORIGINS), np.nan),
            np.full((n, ASSESS_ORIGINS), np.nan),
            np.zeros(n, dtype=np.int64),
            nan.copy(),
        ),
        fresh(n, steps + 1, steps, cfg.interval_level),
    )


def _refused(
    s: Series | None, cfg: ForecastConfig, last: float | None, observed: float
) -> Signal | None:
    """Why `s` (sampled last at `last`, `observed` seconds) cannot be forecast (a Signal
    without a forecast), or None when it can."""
    if s is None or last is None:
        return Signal(last, None, "no samples in the window")
    if s.step > cfg.fit_step + 1e-9:
        why = f"samples every {s.step:g}s are coarser than forecast.fit_step {cfg.fit_step:g}s"
        return Signal(last, None, why)
    if observed < cfg.min_history:
        why = f"only {observed:.0f}s of samples in the window, forecast needs"
        return Signal(last, None, f"{why} {cfg.min_history:.0f}s")
    return None


@dataclass(frozen=True, eq=False)
class _Batch:
    cfg: ForecastConfig
    now: float
    hist: FloatArray  # (n, t) bucket means ending at `now`
    filled: FloatArray  # `hist` forward-filled: what smoothing reads
    steps: int
    prior: Rows  # each row's state (fresh where `found` is False)
    found: BoolArray
    clips: list[Clip]


@dataclass(frozen=True, eq=False)
class _Model:
    """The model's path, interval and coefficients for every row, and which rows may use it."""

    name: str
    mean: FloatArray
    half: FloatArray
    usable: BoolArray
    dropped: list[str | None]
    coefficients: Coefficients | None
    refit: BoolArray
    fitted_at: FloatArray
    modulus: FloatArray
    spread: FloatArray


def _model(b: _Batch, arima: Arima) -> _Model:
    """Coefficients kept where younger than `refit_every`, refitted otherwise; the path
    from the newest point; the rows whose path may be used, and why not."""
    n, steps, level = b.hist.shape[0], b.steps, b.cfg.interval_level
    c: Coefficients | None = None
    if b.cfg.engine == "statsmodels":
        engine = StatsmodelsArima(b.cfg.order)
        mean, lower, _ = engine.forecast(b.hist, steps, level)
        name, half, refit = engine.name, mean - lower, np.ones(n, dtype=bool)
        fitted_at, modulus, stable_rows = np.full(n, np.nan), np.full(n, np.nan), refit
        spread = np.full((n, steps), np.nan)
    else:
        with np.errstate(invalid="ignore"):
            refit = ~(b.now - b.prior.fitted_at < b.cfg.refit_every)  # NaN: never fitted
        old = b.prior.coefficients
        c = Coefficients(old.intercept.copy(), old.phi.copy(), old.sigma2.copy())
        fitted_at, modulus = b.prior.fitted_at.copy(), b.prior.modulus.copy()
        spread = b.prior.spread.copy()
        if refit.any():
            new = arima.fit(b.hist[refit])
            c.intercept[refit], c.phi[refit], c.sigma2[refit] = new.intercept, new.phi, new.sigma2
            modulus[refit] = inverse_root_modulus(new.phi)
            fitted_at[refit] = b.now
            spread[refit] = arima.spread(new, steps)
        name, mean = arima.name, arima.predict(c, b.hist, steps)
        half, stable_rows = half_width(spread, level), stable(modulus)
    finite: BoolArray = np.asarray(np.isfinite(mean).all(axis=1))
    usable = finite & stable_rows & within_band(mean, b.hist)
    dropped: list[str | None] = [None] * n
    for r in np.flatnonzero(~usable).tolist():
        if not finite[r]:
            dropped[r] = f"{name} dropped: no fit"
        elif not stable_rows[r]:
            dropped[r] = (
                f"{name} dropped: unstable fit (a characteristic root inside or near the unit "
                f"circle, inverse root modulus {modulus[r]:.3f})"
            )
        else:
            dropped[r] = f"{name} dropped: its path leaves the window's range"
    return _Model(name, mean, half, usable, dropped, c, refit, fitted_at, modulus, spread)


def _forecast(b: _Batch) -> tuple[list[Forecast], list[bool], Rows]:
    """Every row's forecast, whether it is finite, and the rows' new state."""
    n, steps, nominal = b.hist.shape[0], b.steps, b.cfg.interval_level
    p, d, _ = b.cfg.order
    arima = Arima(p, d)
    model = _model(b, arima)
    scorings = b.prior.scorings
    if model.coefficients is not None and b.cfg.ensemble:
        scorings = _scorings(b, arima, model)
    adaptive = check(b.prior.adaptive, b.hist, b.now, b.cfg.fit_step, nominal)
    mean, half = model.mean.copy(), model.half.copy()
    chosen = np.flatnonzero(scorings.scored & (scorings.method > 0))
    shares = np.zeros((n, len(MEMBERS)))
    offsets = np.zeros(n)
    if chosen.size:
        shares[chosen] = _from_scorings(b, model, scorings, chosen, adaptive, mean, half)
        offsets[chosen] = peak_offset(scorings.peaks[chosen])
    dropped = np.setdiff1d(np.flatnonzero(~model.usable), chosen)
    lasts = last_finite(b.hist)
    if dropped.size:
        mean[dropped] = lasts[dropped][:, None]
        half[dropped] = naive_half_width(b.hist[dropped], steps, nominal)
    lower, upper = np.minimum(mean - half, mean), np.maximum(mean + half, mean)
    lo = np.array([c[0] for c in b.clips])[:, None]
    hi = np.array([np.inf if c[1] is None else c[1] for c in b.clips])[:, None]
    peak = np.clip(mean.max(axis=1) + offsets, lo[:, 0], hi[:, 0])
    mean, lower, upper = np.clip(mean, lo, hi), np.clip(lower, lo, hi), np.clip(upper, lo, hi)
    peak_error = np.where(np.isfinite(peak), peak - mean.max(axis=1), offsets)
    finite = np.isfinite(np.stack([mean, lower, upper], axis=1)).all(axis=(1, 2))
    adaptive = issue(adaptive, b.now, lower, upper)
    forecasts = [
        Forecast(
            origin=b.now,
            step=b.cfg.fit_step,
            mean=mean[r],
            lower=lower[r],
            upper=upper[r],
            level=nominal,
            method=method,
            reason=reason,
            last_value=last,
            errors=errors,
            peak_error=peak,
        )
        for r, ((method, reason, errors), last, peak) in enumerate(
            zip(
                _methods_and_reasons(b, model, scorings, shares, adaptive),
                lasts.tolist(),
                peak_error.tolist(),
                strict=True,
            )
        )
    ]
    coefficients = model.coefficients or b.prior.coefficients
    after = Rows(
        b.prior.keys, model.fitted_at, coefficients, model.modulus, model.spread, scorings, adaptive
    )
    ok: list[bool] = finite.tolist()
    return forecasts, ok, after


def _scorings(b: _Batch, arima: Arima, model: _Model) -> Scorings:
    """Each row's scoring: kept while its coefficients are (errors rolled on to the origins
    completed since), made afresh where refitted now or not scored yet."""
    assert model.coefficients is not None
    s = take(b.prior.scorings, np.arange(b.hist.shape[0]))  # a copy, written in place
    todo = np.flatnonzero(model.refit | ~s.scored)
    live_arima = np.where(model.usable[:, None], model.mean, np.nan)
    for i in range(0, todo.size, ASSESS_CHUNK):
        rows = todo[i : i + ASSESS_CHUNK]
        a = assess(arima, model.coefficients.rows(rows), b.hist[rows], b.steps, live_arima[rows])
        if a is not None:
            _put_assessment(s, rows, a, b)
    kept = np.setdiff1d(np.flatnonzero(s.scored & (s.method > 0)), todo)
    if kept.size:
        _roll_on(b, arima, model, s, kept)
    return s


def _put_assessment(s: Scorings, rows: IntArray, a: Assessment, b: _Batch) -> None:
    """An assessment of `rows` written into their scorings."""
    errors = np.stack([a.errors[k] for k in CANDIDATES], axis=1)
    methods = [
        METHODS.index(m or "")
        for m in map(choose_method, (errors_dict(row) for row in errors.tolist()))
    ]
    method = np.array(methods, dtype=np.int64)
    last = method == METHODS.index("last_value")
    chosen = np.abs(
        np.where(last[:, None, None], a.residuals["last_value"], a.residuals["ensemble"])
    )
    chosen_peaks = np.where(last[:, None], a.peak_errors["last_value"], a.peak_errors["ensemble"])
    depth = chosen.shape[1]  # at most ASSESS_ORIGINS
    recent = np.full((rows.size, b.steps, ASSESS_ORIGINS), np.nan)
    peaks = np.full((rows.size, ASSESS_ORIGINS), np.nan)
    some = method > 0  # a scoring without a method keeps no errors
    recent[some, :, :depth] = chosen[some].transpose(0, 2, 1)
    peaks[some, :depth] = chosen_peaks[some]
    s.scored[rows], s.method[rows], s.weights[rows] = True, method, a.raw_weights
    s.errors[rows], s.ses_best[rows], s.ses_inv[rows] = errors, a.ses_best, a.ses_inv
    s.recent[rows], s.peaks[rows], s.head[rows] = recent, peaks, depth % ASSESS_ORIGINS
    s.newest[rows] = b.now - (b.hist.shape[1] - 1 - a.newest) * b.cfg.fit_step


def _roll_on(b: _Batch, arima: Arima, model: _Model, s: Scorings, kept: IntArray) -> None:
    """The kept scorings of rows `kept` with the chosen method's errors at the origins
    completed since each was last rolled; the oldest beyond ASSESS_ORIGINS dropped."""
    assert model.coefficients is not None
    step, steps, t = b.cfg.fit_step, b.steps, b.hist.shape[1]
    spacing = max(1, steps // ORIGIN_SPACING) * step
    last_complete = b.now - steps * step  # an origin whose whole horizon is observed
    count = np.floor((last_complete - s.newest[kept]) / spacing + 1e-9).astype(np.int64)
    count = np.clip(count, 0, ASSESS_ORIGINS)
    rows = np.repeat(kept, count)
    k = np.arange(rows.size) - np.repeat(np.cumsum(count) - count, count) + 1
    times = np.repeat(s.newest[kept], count) + spacing * k
    origins = t - 1 - np.round((b.now - times) / step).astype(np.int64)
    inside = origins >= lowest_origin(arima)
    rows, origins, times = rows[inside], origins[inside], times[inside]
    if not rows.size:
        return
    ensemble = s.method == METHODS.index("ensemble")
    errors, peaks = errors_at(
        arima,
        model.coefficients,
        b.hist,
        b.filled,
        rows,
        origins,
        (s.weights, s.ses_best, s.ses_inv, ensemble),
        model.usable,
        steps,
    )
    # each row's new origins follow each other, oldest first: each takes the ring's place
    # after the one before, the oldest origins' places
    first = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    moved, count = rows[first], np.diff(np.r_[first, rows.size])
    place = (s.head[rows] + np.arange(rows.size) - np.repeat(first, count)) % ASSESS_ORIGINS
    s.recent[rows, :, place], s.peaks[rows, place] = errors, peaks
    s.head[moved] = (s.head[moved] + count) % ASSESS_ORIGINS
    s.newest[moved] = times[first + count - 1]


def _from_scorings(
    b: _Batch,
    model: _Model,
    s: Scorings,
    chosen: IntArray,
    adaptive: Adaptive,
    mean: FloatArray,
    half: FloatArray,
) -> FloatArray:
    """The rows `chosen` from their scorings: the kept weights' ensemble (or the last value)
    into `mean`, the conformal half width at the adaptive level (the model's or the last
    value's where too few errors) into `half`; returns the normalized weights."""
    live_arima = np.where(model.usable[chosen][:, None], model.mean[chosen], np.nan)
    hist, filled = b.hist[chosen], b.filled[chosen]
    members = live_members(hist, filled, s.ses_best[chosen], s.ses_inv[chosen], live_arima)
    weights = normalized(s.weights[chosen], members)
    ensemble = combine(weights, members)
    last_value = s.method[chosen] == METHODS.index("last_value")
    mean[chosen] = np.where(last_value[:, None], members["last_value"], ensemble)
    found = conformal_half_width(s.recent[chosen], adaptive.level[chosen])
    short = ~np.isfinite(found).all(axis=1)
    if short.any():
        rows = chosen[short]
        usable = model.usable[rows]
        fallback = model.half[rows]
        if not usable.all():
            fallback[~usable] = naive_half_width(
                b.hist[rows[~usable]], b.steps, b.cfg.interval_level
            )
        found[short] = fallback
    half[chosen] = found
    return weights


def _methods_and_reasons(
    b: _Batch, model: _Model, s: Scorings, shares: FloatArray, a: Adaptive
) -> list[tuple[str, str, dict[str, float]]]:
    """Each row's method, the reason that names how its forecast was made, and the recent
    errors it reports."""
    labels = [model.name if m == "arima" else LABELS[m] for m in MEMBERS]
    weights = ", ".join(f"{label} {{:.2f}}" for label in labels)  # a row's shares go in
    young = ", too little history to assess" if b.cfg.ensemble and model.coefficients else ""
    nominal = b.cfg.interval_level
    columns = (s.scored, s.method, s.errors, shares, a.level, a.points, a.misses)
    rows = zip(*(c.tolist() for c in columns), strict=True)
    out = []
    for r, (scored, code, row, share, level, points, misses) in enumerate(rows):
        if scored and code:
            method = METHODS[code]
            errors = errors_dict(row)
            why = _scored_reason(model, method, weights.format(*share), errors, s, r)
            out.append((method, f"{why}; {coverage_text(nominal, level, points, misses)}", errors))
        elif model.usable[r]:
            out.append((model.name, f"{model.name} fit{young}", {}))
        else:
            out.append(("last_value", f"last value: {model.dropped[r]}", {}))
    return out


def _scored_reason(
    model: _Model, method: str, weights: str, e: Mapping[str, float], s: Scorings, r: int
) -> str:
    """A scored row's reason: the members' weights and recent errors, any member dropped."""
    arima = f"{e['arima']:.2f}" if "arima" in e else "-"
    ens = f"{e['ensemble']:.2f}" if "ensemble" in e else "-"
    scores = (
        f"recent error {ens} vs last value {e['last_value']:.2f}, "
        f"window mean {e.get('window_mean', np.nan):.2f}, {model.name} {arima}"
    )
    dropped = f"; {model.dropped[r]}" if model.dropped[r] else ""
    if method == "ensemble":
        alpha = SES_ALPHAS[s.ses_best[r]]
        return (
            f"ensemble weighted by recent error ({weights}; smoothing alpha {alpha:.2f}): "
            f"{scores}{dropped}"
        )
    return (
        f"last_value: beats the ensemble ({ens}) by over {FALLBACK_MARGIN:.0%} on recent "
        f"data; {scores}{dropped}"
    )
