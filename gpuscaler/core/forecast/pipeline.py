"""A batch of series forecast together: windows, config, state and `now` in; each series'
forecast (or why there is none) and the new state out.

Per series: ARIMA refitted every `forecast.refit_every` (the coefficients kept between);
the ensemble of `ensemble.MEMBERS` weighted by the scoring made at the refit, or the last
value when that has clearly been better, its split-conformal interval at the series'
adaptive level from the chosen method's recent errors (rolled on every tick), and its
peak. A series too young to score takes the model's own path and interval; a fit that is
unstable or whose path leaves the window's band is never used (the last value instead).
Every forecast's reason names the members' weights and scores and any member dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast.arima import (
    Arima,
    Coefficients,
    StatsmodelsArima,
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
    issue,
    naive_half_width,
    peak_offset,
)
from gpuscaler.core.forecast.members import SES_ALPHAS, bucket_rows
from gpuscaler.core.forecast.state import (
    EMPTY,
    ForecastState,
    Scoring,
    SeriesState,
    adaptive_of,
)
from gpuscaler.core.model import BoolArray, FloatArray, Forecast, Series, Signal

Clip = tuple[float, float | None]
ASSESS_CHUNK = 256
"""Series scored together: bounds the (series, origins, steps) temporaries."""
LABELS = MappingProxyType(
    {
        "arima": "",
        "ses": "smoothing",
        "ses_avg": "averaged smoothing",
        "window_mean": "window mean",
    }
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
    each series' state is read from `state` and its new state returned (only those keys).
    `clips`: each series' bounds (low, high or None), (0, None) by default."""
    last = [s.last_sample_time() if s is not None else None for s in series]
    signals: list[Signal | None] = [_refused(s, cfg, t) for s, t in zip(series, last, strict=True)]
    index = [i for i, s in enumerate(signals) if s is None]
    out: dict[str, SeriesState] = {}
    if index:
        rows = [s for i in index if (s := series[i]) is not None]
        batch = _Batch(
            cfg,
            now,
            bucket_rows(rows, cfg.fit_step, now),
            [state.series.get(keys[i]) if keys is not None else None for i in index],
            [clips[i] if clips is not None else (0.0, None) for i in index],
        )
        # an overflowing series (huge values) is flagged below, not warned about
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            forecasts, states = _forecast(batch)
        for i, f, kept in zip(index, forecasts, states, strict=True):
            problem = None if f.is_finite() else "forecast is not finite (NaN or Inf)"
            signals[i] = Signal(last[i], f, problem)
            if keys is not None:
                out[keys[i]] = kept
    return [s for s in signals if s is not None], ForecastState(out)


def merged(*states: ForecastState) -> ForecastState:
    """The series of several states together (the batches of one tick)."""
    return ForecastState({k: v for s in states for k, v in s.series.items()})


def _refused(s: Series | None, cfg: ForecastConfig, last: float | None) -> Signal | None:
    """Why `s` cannot be forecast (a Signal without a forecast), or None when it can."""
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


@dataclass(frozen=True, eq=False)
class _Batch:
    cfg: ForecastConfig
    now: float
    hist: FloatArray  # (n, t) bucket means ending at `now`
    prior: list[SeriesState | None]
    clips: list[Clip]

    @property
    def steps(self) -> int:
        return max(1, round(self.cfg.horizon / self.cfg.fit_step))


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


def _model(b: _Batch, arima: Arima) -> _Model:
    """Coefficients kept where younger than `refit_every`, refitted otherwise; the path
    from the newest point; the rows whose path may be used, and why not."""
    n, steps, level = b.hist.shape[0], b.steps, b.cfg.interval_level
    if b.cfg.engine == "statsmodels":
        engine = StatsmodelsArima(b.cfg.order)
        mean, lower, _ = engine.forecast(b.hist, steps, level)
        nan = np.full(n, np.nan)
        ones = np.ones(n, dtype=bool)
        return _usable(engine.name, b.hist, mean, mean - lower, ones, None, ones, nan, nan)
    p = arima.p
    due = [
        s is None or b.now - s.fitted_at >= b.cfg.refit_every or s.phi.shape != (p,)
        for s in b.prior
    ]
    c = Coefficients(np.empty(n), np.empty((n, p)), np.empty(n))
    fitted_at, modulus = np.full(n, b.now), np.empty(n)
    kept = [r for r, d in enumerate(due) if not d]
    if kept:
        old = [s for r in kept if (s := b.prior[r]) is not None]
        c.intercept[kept] = [s.intercept for s in old]
        c.phi[kept] = np.stack([s.phi for s in old])
        c.sigma2[kept] = [s.sigma2 for s in old]
        fitted_at[kept] = [s.fitted_at for s in old]
        modulus[kept] = [s.modulus for s in old]
    refit = [r for r, d in enumerate(due) if d]
    if refit:
        new = arima.fit(b.hist[refit])
        c.intercept[refit], c.phi[refit], c.sigma2[refit] = new.intercept, new.phi, new.sigma2
        modulus[refit] = inverse_root_modulus(new.phi)
    mean = arima.predict(c, b.hist, steps)
    half = arima.half_width(c, steps, level)
    refitted = np.array(due, dtype=bool)
    return _usable(arima.name, b.hist, mean, half, stable(modulus), c, refitted, fitted_at, modulus)


def _usable(
    name: str,
    hist: FloatArray,
    mean: FloatArray,
    half: FloatArray,
    stable_rows: BoolArray,
    c: Coefficients | None,
    refit: BoolArray,
    fitted_at: FloatArray,
    modulus: FloatArray,
) -> _Model:
    finite: BoolArray = np.asarray(np.isfinite(mean).all(axis=1))
    banded = within_band(mean, hist)
    usable = finite & stable_rows & banded
    dropped: list[str | None] = [None] * len(usable)
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
    return _Model(name, mean, half, usable, dropped, c, refit, fitted_at, modulus)


def _forecast(b: _Batch) -> tuple[list[Forecast], list[SeriesState]]:
    n, steps, nominal = b.hist.shape[0], b.steps, b.cfg.interval_level
    p, d, _ = b.cfg.order
    arima = Arima(p, d)
    model = _model(b, arima)
    scorings: list[Scoring | None] = [None] * n
    if model.coefficients is not None and b.cfg.ensemble:
        scorings = _scorings(b, arima, model)
    slots = steps + 1
    adaptive = check(
        adaptive_of(b.prior, slots, steps, nominal), b.hist, b.now, b.cfg.fit_step, nominal
    )
    mean, half = model.mean.copy(), model.half.copy()
    chosen = [r for r, s in enumerate(scorings) if s is not None and s.method is not None]
    shares = np.zeros((n, len(MEMBERS)))
    if chosen:
        shares[chosen] = _from_scorings(b, model, scorings, chosen, adaptive, mean, half)
    dropped = [r for r in range(n) if not model.usable[r] and r not in set(chosen)]
    lasts = last_finite(b.hist)
    if dropped:
        mean[dropped] = lasts[dropped][:, None]
        half[dropped] = naive_half_width(b.hist[dropped], steps, nominal)
    lower, upper = np.minimum(mean - half, mean), np.maximum(mean + half, mean)
    offsets = np.zeros(n)
    if chosen:
        recent_peaks = np.stack([s.peaks for r in chosen if (s := scorings[r]) is not None])
        offsets[chosen] = peak_offset(recent_peaks)
    lo = np.array([c[0] for c in b.clips])
    hi = np.array([np.inf if c[1] is None else c[1] for c in b.clips])
    peak = np.clip(mean.max(axis=1) + offsets, lo, hi)
    mean = np.clip(mean, lo[:, None], hi[:, None])
    lower = np.clip(lower, lo[:, None], hi[:, None])
    upper = np.clip(upper, lo[:, None], hi[:, None])
    peak_error = np.where(np.isfinite(peak), peak - mean.max(axis=1), offsets)
    adaptive = issue(adaptive, b.now, lower, upper)
    forecasts = []
    for r in range(n):
        method, reason = _method_and_reason(b, model, scorings[r], shares[r], adaptive, r)
        scoring = scorings[r]
        forecasts.append(
            Forecast(
                origin=b.now,
                step=b.cfg.fit_step,
                mean=mean[r],
                lower=lower[r],
                upper=upper[r],
                level=nominal,
                method=method,
                reason=reason,
                last_value=float(lasts[r]),
                errors=dict(scoring.errors) if scoring is not None and scoring.method else {},
                peak_error=float(peak_error[r]),
            )
        )
    return forecasts, _states(model, scorings, adaptive)


def _states(model: _Model, scorings: list[Scoring | None], a: Adaptive) -> list[SeriesState]:
    c = model.coefficients
    n = len(scorings)
    if c is None:
        c = Coefficients(np.full(n, np.nan), np.full((n, 0), np.nan), np.full(n, np.nan))
    return [
        SeriesState(
            float(model.fitted_at[r]),
            float(c.intercept[r]),
            c.phi[r].copy(),
            float(c.sigma2[r]),
            float(model.modulus[r]),
            scorings[r],
            float(a.level[r]),
            int(a.points[r]),
            int(a.misses[r]),
            float(a.checked_at[r]),
            a.issued_at[r].copy(),
            a.bounds[r].copy(),
        )
        for r in range(n)
    ]


def _scorings(b: _Batch, arima: Arima, model: _Model) -> list[Scoring | None]:
    """Each row's scoring: kept from its state while its coefficients are (its errors
    rolled on to the origins completed since), made afresh where refitted now or not
    scored yet; None where the window is too short to score."""
    assert model.coefficients is not None
    steps = b.steps
    out: list[Scoring | None] = [
        s.scoring
        if s is not None
        and not model.refit[r]
        and s.scoring is not None
        and s.scoring.recent.shape[1] == steps
        else None
        for r, s in enumerate(b.prior)
    ]
    todo = [r for r, s in enumerate(out) if s is None]
    live_arima = np.where(model.usable[:, None], model.mean, np.nan)
    for i in range(0, len(todo), ASSESS_CHUNK):
        rows = todo[i : i + ASSESS_CHUNK]
        part = model.coefficients.rows(rows)
        a = assess(arima, part, b.hist[rows], steps, live_arima[rows])
        if a is not None:
            for j, r in enumerate(rows):
                out[r] = _scoring_of(a, j, b)
    fresh = set(todo)
    kept = [r for r, s in enumerate(out) if s is not None and s.method and r not in fresh]
    if kept:
        _roll_on(b, arima, model, out, kept)
    return out


def _scoring_of(a: Assessment, i: int, b: _Batch) -> Scoring:
    """Row i of an assessment as a series' scoring."""
    errors = {k: float(v[i]) for k, v in a.errors.items() if np.isfinite(v[i])}
    method = choose_method(errors)
    depth, steps = ASSESS_ORIGINS, b.steps
    recent, peaks = np.full((depth, steps), np.nan), np.full(depth, np.nan)
    if method is not None:
        found = np.abs(a.residuals[method][i])
        recent[depth - found.shape[0] :] = found
        peaks[depth - found.shape[0] :] = a.peak_errors[method][i]
    newest = b.now - (b.hist.shape[1] - 1 - a.newest) * b.cfg.fit_step
    return Scoring(
        method, a.raw_weights[i], errors, int(a.ses_best[i]), a.ses_inv[i], recent, peaks, newest
    )


def _roll_on(
    b: _Batch, arima: Arima, model: _Model, out: list[Scoring | None], kept: list[int]
) -> None:
    """The kept scorings of `kept` with the chosen method's errors at the origins
    completed since each was last rolled (every origin spacing, as `assess` spaces them),
    with the kept coefficients and weights; the oldest beyond ASSESS_ORIGINS dropped."""
    assert model.coefficients is not None
    step, steps, t = b.cfg.fit_step, b.steps, b.hist.shape[1]
    spacing = max(1, steps // ORIGIN_SPACING) * step
    last_complete = b.now - steps * step  # an origin whose whole horizon is observed
    lowest = lowest_origin(arima)
    pairs: list[tuple[int, int, float]] = []  # (row, origin index, origin time)
    for r in kept:
        s = out[r]
        assert s is not None
        k = np.arange(1, int((last_complete - s.newest) / spacing + 1e-9) + 1)
        times = s.newest + spacing * k
        js = t - 1 - np.round((b.now - times) / step).astype(np.int64)
        pairs += [
            (r, j, tm) for j, tm in zip(js.tolist(), times.tolist(), strict=True) if j >= lowest
        ]
    if not pairs:
        return
    n = b.hist.shape[0]
    raw, best = np.zeros((n, len(MEMBERS))), np.zeros(n, dtype=np.int64)
    inv, ensemble = np.ones((n, len(SES_ALPHAS))), np.zeros(n, dtype=bool)
    for r in kept:
        s = out[r]
        assert s is not None
        raw[r], best[r], inv[r], ensemble[r] = (
            s.weights,
            s.ses_best,
            s.ses_inv,
            s.method == "ensemble",
        )
    rows = np.array([p[0] for p in pairs])
    origins = np.array([p[1] for p in pairs])
    errors, peaks = errors_at(
        arima,
        model.coefficients,
        b.hist,
        rows,
        origins,
        raw,
        best,
        inv,
        ensemble,
        model.usable,
        steps,
    )
    for r in sorted(set(rows.tolist())):
        mine = rows == r
        s = out[r]
        assert s is not None
        count = int(mine.sum())
        recent = np.concatenate([s.recent, errors[mine]])[count:]
        recent_peaks = np.concatenate([s.peaks, peaks[mine]])[count:]
        newest = max(tm for row, _, tm in pairs if row == r)
        out[r] = Scoring(
            s.method, s.weights, s.errors, s.ses_best, s.ses_inv, recent, recent_peaks, newest
        )


def _from_scorings(
    b: _Batch,
    model: _Model,
    scorings: list[Scoring | None],
    chosen: list[int],
    adaptive: Adaptive,
    mean: FloatArray,
    half: FloatArray,
) -> FloatArray:
    """The rows `chosen` (each scored with a method) from their scorings: the ensemble
    with the kept weights over the members' paths at the newest point (or the last value),
    into `mean`; the conformal half width at the row's adaptive level into `half` (the
    model's, or the last value's, where too few errors). Returns the members' normalized
    weights (rows, members)."""
    sc = [s for r in chosen if (s := scorings[r]) is not None]
    raw = np.stack([s.weights for s in sc])
    best = np.array([s.ses_best for s in sc], dtype=np.int64)
    inv = np.stack([s.ses_inv for s in sc])
    live_arima = np.where(model.usable[chosen][:, None], model.mean[chosen], np.nan)
    members = live_members(b.hist[chosen], best, inv, live_arima)
    weights = normalized(raw, members)
    ensemble = combine(weights, members)
    last_value = np.array([s.method == "last_value" for s in sc])
    mean[chosen] = np.where(last_value[:, None], members["last_value"], ensemble)
    found = conformal_half_width(np.stack([s.recent for s in sc]), adaptive.level[chosen])
    short = ~np.isfinite(found).all(axis=1)
    for i in np.flatnonzero(short).tolist():
        r = chosen[i]
        if model.usable[r]:
            found[i] = model.half[r]
        else:
            found[i] = naive_half_width(b.hist[r : r + 1], b.steps, b.cfg.interval_level)[0]
    half[chosen] = found
    return weights


def _method_and_reason(
    b: _Batch, model: _Model, s: Scoring | None, shares: FloatArray, a: Adaptive, r: int
) -> tuple[str, str]:
    """The row's method and the reason that names how its forecast was made."""
    if s is not None and s.method is not None:
        labels = [model.name if m == "arima" else LABELS[m] for m in MEMBERS]
        weights = ", ".join(
            f"{label} {w:.2f}" for label, w in zip(labels, shares.tolist(), strict=True)
        )
        e = s.errors
        arima = f"{e['arima']:.2f}" if "arima" in e else "-"
        ens = f"{e['ensemble']:.2f}" if "ensemble" in e else "-"
        scores = (
            f"recent error {ens} vs last value {e['last_value']:.2f}, "
            f"window mean {e.get('window_mean', np.nan):.2f}, {model.name} {arima}"
        )
        dropped = f"; {model.dropped[r]}" if model.dropped[r] else ""
        if s.method == "ensemble":
            why = (
                f"ensemble weighted by recent error ({weights}; smoothing alpha "
                f"{SES_ALPHAS[s.ses_best]:.2f}): {scores}{dropped}"
            )
        else:
            why = (
                f"last_value: beats the ensemble ({ens}) by over {FALLBACK_MARGIN:.0%} on "
                f"recent data; {scores}{dropped}"
            )
        nominal = b.cfg.interval_level
        coverage = coverage_text(nominal, float(a.level[r]), int(a.points[r]), int(a.misses[r]))
        return s.method, f"{why}; {coverage}"
    if model.usable[r]:
        young = ", too little history to assess" if b.cfg.ensemble and model.coefficients else ""
        return model.name, f"{model.name} fit{young}"
    return "last_value", f"last value: {model.dropped[r]}"
