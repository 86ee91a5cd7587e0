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
from typing import cast

import numpy as np

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast.assembly import Adaptive, Batch, Model, assembled
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
    SES_ALPHAS,
    WINDOW_MEAN_POINTS,
    Assessment,
    SesTape,
    assess,
    choose_method,
)
from gpuscaler.core.forecast.intervals import Checked, check_rows, issue_checked
from gpuscaler.core.forecast.leading import LEAD_MARGIN, Ratio, fit_ratio, lead
from gpuscaler.core.forecast.made import carried
from gpuscaler.core.forecast.made import signal as made_signal
from gpuscaler.core.forecast.scored import refresh, score
from gpuscaler.core.model import (
    BoolArray,
    FitState,
    FloatArray,
    Forecast,
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


def _samples(
    series: Sequence[Series | None],
) -> tuple[list[tuple[float | None, int]], FloatArray | None]:
    """Each series' last sample time (`Series.last_sample_time`) and finite samples; the
    series on one grid (one query's window, the usual case) found together, their values
    stacked (rows: the series that are not None, in order; kept for the bucketing)."""
    out: list[tuple[float | None, int]] = [(None, 0)] * len(series)
    rows = [i for i, s in enumerate(series) if s is not None]
    if not rows:
        return out, None
    first = series[rows[0]]
    assert first is not None
    if len(rows) > 1 and all(
        (s := series[i]) is not None
        and s.start == first.start
        and s.step == first.step
        and len(s.values) == len(first.values)
        for i in rows
    ):
        # their stack, without np.stack's view a row (issue 20): one copy, the same block
        values = [s.values for i in rows if (s := series[i]) is not None]
        stacked = np.concatenate(values).reshape(len(values), len(first.values))
        finite = np.isfinite(stacked)
        width = finite.shape[1]
        if width and finite.all():  # the usual case: every sample finite, counted at once
            if len(rows) == len(series):  # and every series there: one figure for all
                return [(first.start + first.step * float(width - 1), width)] * len(rows), stacked
            counts, idx = [width] * len(rows), [width - 1] * len(rows)
        else:
            counts = finite.sum(axis=1).tolist()
            if width and finite[:, -1].all():  # each row's last sample finite: its last
                idx = [width - 1] * len(rows)
            else:
                idx = (width - 1 - np.argmax(finite[:, ::-1], axis=1)).tolist()
        for r, i in enumerate(rows):
            last = first.start + first.step * float(idx[r]) if counts[r] else None
            out[i] = (last, counts[r])
        return out, stacked
    for i in rows:
        s = series[i]
        assert s is not None
        out[i] = (s.last_sample_time(), int(np.isfinite(s.values).sum()))
    return out, None


def _admit(s: Series | None, cfg: ForecastConfig, last: float | None, finite: int) -> Signal | None:
    """Why `s` cannot be forecast (a Signal without forecast), or None when it can (`last`,
    `finite`: its last sample time and finite samples)."""
    if s is None or last is None:
        return Signal(last, None, "no samples in the window")
    if s.step > cfg.fit_step + 1e-9:
        return Signal(
            last,
            None,
            f"samples every {s.step:g}s are coarser than forecast.fit_step {cfg.fit_step:g}s",
        )
    observed = float(finite) * s.step
    if observed < cfg.min_history:
        return Signal(
            last,
            None,
            f"only {observed:.0f}s of samples in the window, forecast needs {cfg.min_history:.0f}s",
        )
    return None


def _admitted(
    series: Sequence[Series | None],
    cfg: ForecastConfig,
    samples: list[tuple[float | None, int]],
    one_grid: bool,
) -> list[Signal | None]:
    """`_admit` of each series (`samples`: `_samples`' figures); series on `one_grid` with
    one figure for all (every one there, every sample finite) are admitted together."""
    if (
        one_grid
        and samples.count(samples[0]) == len(series)
        and _admit(series[0], cfg, *samples[0]) is None
    ):
        return [None] * len(series)
    return [_admit(s, cfg, *found) for s, found in zip(series, samples, strict=True)]


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
    clips: Sequence[tuple[float, float | None]] | None = None,
) -> list[Signal]:
    """Forecast each series `cfg.horizon` ahead of `now`, or say why not.

    With `keys`, each series' fitted coefficients are taken from `prior` while younger than
    `cfg.refit_every`, and so is its ensemble scoring (weights, recent errors, conformal
    errors, peak offset; `rescore` scores it again at every call, the cost before issue
    18); its adaptive interval state is carried on, and the states to keep for the next
    call are put in `states`. `clips`: each series' own clip instead of `clip` (issue 20:
    a tick's pools and workloads in one batch)."""
    samples, stacked = _samples(series)
    signals = _admitted(series, cfg, samples, stacked is not None)
    index = [i for i, s in enumerate(signals) if s is None]
    if index:
        rows = [s for i in index if (s := series[i]) is not None]
        values = stacked
        if stacked is not None and len(index) < stacked.shape[0]:
            position = {
                i: r for r, i in enumerate(k for k, s in enumerate(series) if s is not None)
            }
            values = stacked[[position[i] for i in index]]
        hist = bucket_rows(rows, cfg.fit_step, now, values, aligned=values is not None)
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
            [clips[i] for i in index] if clips is not None else None,
        )
        forecasts, finite = _forecast_batch(batch)
        lasts = [samples[i][0] for i in index]
        problems = [None if ok else "forecast is not finite (NaN or Inf)" for ok in finite]
        made = list(map(made_signal, lasts, forecasts, problems))  # without __init__
        if len(index) == len(signals):  # every series forecast (the usual case)
            return made
        for i, signal in zip(index, made, strict=True):
            signals[i] = signal
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
        modulus = fitted.modulus if fitted.modulus is not None else inverse_root_modulus(fitted.phi)
    else:
        paths = b.engine.forecast(b.hist, b.steps, level)
        stable, modulus = np.ones(n, dtype=bool), np.zeros(n)
    finite: BoolArray = np.asarray(np.isfinite(paths.mean).all(axis=1))
    banded = within_band(paths.mean, b.hist)
    usable = finite & stable & banded
    dropped: list[str | None] = [None] * n
    if not usable.all():  # the reasons of the rows dropped (issue 20: the others' None)
        _dropped(b.engine.name, usable, finite, stable, modulus, dropped)
    return Model(paths, fitted, usable, dropped)


def _dropped(
    name: str,
    usable: BoolArray,
    finite: BoolArray,
    stable: BoolArray,
    modulus: FloatArray,
    dropped: list[str | None],
) -> None:
    """Why each row not `usable` is dropped (no finite path, an unstable fit, or else a
    path out of the window's band), put in `dropped`."""
    for r in np.flatnonzero(~usable).tolist():
        if not finite[r]:
            dropped[r] = f"{name} dropped: no fit"
        elif not stable[r]:
            dropped[r] = (
                f"{name} dropped: unstable fit (a characteristic root inside or near the unit "
                f"circle, inverse root modulus {modulus[r]:.3f})"
            )
        else:
            dropped[r] = f"{name} dropped: its path leaves the window's range"


def _forecast_batch(b: Batch) -> tuple[list[Forecast], list[bool]]:
    """The evidence-weighted ensemble, unless the last value has clearly been more
    accurate on the series' recent history; the engine's path alone when there is too
    little history to assess (and the last value when that path was dropped). And for
    each, whether it is finite (`Forecast.is_finite`)."""
    model = _model(b)
    scored: list[Scored | None] = [None] * b.hist.shape[0]
    tape = SesTape(b.hist)  # the smoothing levels, one pass for the refresh and live paths
    if model.fitted is not None and b.cfg.ensemble:
        scored = _scoring(b, model, tape)
    keyed, checked = _adaptive(b)
    out, finite, lower, upper = assembled(b, model, scored, _figures(b, keyed, checked), tape)
    if not keyed:
        return out, finite
    assert checked is not None
    every = len(keyed) == len(out)
    issued = issue_checked(
        checked, lower if every else lower[keyed], upper if every else upper[keyed], b.cfg.fit_step
    )
    states, keys = b.states, b.keys
    for r, interval in zip(keyed, issued, strict=True):  # each state made once a tick
        key = keys[r]
        assert key is not None
        state, sc = states[key], scored[r]
        kept = state.scored
        states[key] = carried(state, interval, kept if sc is None or kept is sc else sc)
    return out, finite


def _figures(b: Batch, keyed: list[int], checked: Checked | None) -> Adaptive:
    """Each row's adaptive level, points and misses (`assembled`): the checked rows' own,
    the nominal level and none for a row without a kept state."""
    n = b.hist.shape[0]
    if checked is not None and len(keyed) == n:
        return checked.level, checked.points, checked.misses
    level, points, misses = [b.cfg.interval_level] * n, [0] * n, [0] * n
    if checked is not None:
        for i, r in enumerate(keyed):
            level[r], points[r], misses[r] = checked.level[i], checked.points[i], checked.misses[i]
    return level, points, misses


def _scoring(b: Batch, model: Model, tape: SesTape | None = None) -> list[Scored | None]:
    """Each row's ensemble scoring: kept from the previous tick while its coefficients
    are (the state reused as is), made afresh for the rows refitted now, without a key
    or with `rescore`; None where there is too little history to score."""
    assert isinstance(b.engine, LeastSquaresArima) and model.fitted is not None
    out: list[Scored | None] = [None] * len(b.keys) if b.rescore else _kept(b)
    _refreshed(b, model, out, tape)
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
    return out


def _refreshed(
    b: Batch, model: Model, out: list[Scored | None], tape: SesTape | None = None
) -> None:
    """The kept scorings in `out` with the errors at the origins completed since they were
    made. A scoring that names no method (too little evidence: the row takes the engine's
    path or the last value) is kept as made: its errors are never read, and its next refit
    scores the row afresh (issue 18: a young window's rows all hold one)."""
    assert isinstance(b.engine, LeastSquaresArima) and model.fitted is not None
    kept = [r for r, s in enumerate(out) if s is not None and s.method is not None]
    if not kept:
        return
    old = [s for s in (out[r] for r in kept) if s is not None]
    if len(kept) == len(out):  # every row (the steady lanes): no copies of the rows
        new = refresh(
            b.engine, model.fitted, b.hist, old, model.usable, b.now, b.cfg.fit_step, tape
        )
    else:
        f, rows = model.fitted, np.array(kept)
        part = Fitted(f.intercept[rows], f.phi[rows], f.sigma2[rows])
        hist, usable = b.hist[rows], model.usable[rows]
        rows_tape = tape.rows(rows) if tape is not None else None
        new = refresh(b.engine, part, hist, old, usable, b.now, b.cfg.fit_step, rows_tape)
    for r, sc in zip(kept, new, strict=True):
        out[r] = sc


def _kept(b: Batch) -> list[Scored | None]:
    """Each row's scoring kept on its series' state, if its coefficients were not
    refitted now (the state is the prior one); None without a key or kept scoring."""
    now, before = _found(b)
    out = [s.scored if s is not None and s is p else None for s, p in zip(now, before, strict=True)]
    steps = b.steps
    for r, sc in enumerate(out):
        if sc is not None and sc.abs_errors.shape[1] != steps:
            out[r] = None  # scored for another horizon (the config changed): score again
    return out


def _found(b: Batch) -> tuple[list[FitState | None], list[FitState | None]]:
    """Each row's state in `b.states` and in `b.prior` (None: none, or no key), looked up
    row by row in C when every row has a key (the lanes)."""
    keys, states, prior = b.keys, b.states, b.prior
    if None not in keys:
        named = cast("Sequence[str]", keys)
        return list(map(states.get, named)), list(map(prior.get, named))
    now = [states.get(k) if k is not None else None for k in keys]
    return now, [prior.get(k) if k is not None else None for k in keys]


def _adaptive(b: Batch) -> tuple[list[int], Checked | None]:
    """The rows with a kept state, and their adaptive intervals checked against what was
    observed since the previous tick, all at once (None without such rows)."""
    now, before = _found(b)
    keyed = [r for r, s in enumerate(now) if s is not None]
    priors = [s.interval if (s := before[r]) is not None else None for r in keyed]
    if not keyed:
        return keyed, None
    hist = b.hist if len(keyed) == b.hist.shape[0] else b.hist[keyed]
    return keyed, check_rows(priors, hist, b.now, b.cfg.fit_step, b.cfg.interval_level)
