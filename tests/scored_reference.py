"""The kept scorings as gpuscaler/core/forecast/scored.py (with `_scoring`, `_refreshed`
and `_kept` of forecast/__init__.py and `_reason` of forecast/assembly.py) made them at
79c90bb, before issue 20's fc5 kept their arrays as rows of batch arrays: the oracle of
tests/forecast_reference.py for those parts. Copied as they were (only the imports
changed), with `arima_in_window` as it was at ed31a8e (before fr7 rolled it from
(row, origin) pairs); the tape, the window means and the assessment as they were at
3ecdbd8 (tests/tape_reference.py, before rf8)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from tape_reference import SesTape, assess, ses_last, window_means

from gpuscaler.core.forecast.assembly import Batch, Model
from gpuscaler.core.forecast.engines import Fitted, LeastSquaresArima, last_finite, nanmean_rows
from gpuscaler.core.forecast.ensemble import (
    ASSESS_CHUNK,
    ASSESS_ORIGINS,
    FALLBACK_MARGIN,
    MEMBERS,
    ORIGIN_SPACING,
    WINDOW_MEAN_POINTS,
    Assessment,
    SmoothingLevels,
    choose_method,
    combine,
    normalized,
    smoothing_live,
)
from gpuscaler.core.forecast.intervals import peak_offset, ranked_half_width
from gpuscaler.core.model import BoolArray, FloatArray, IntArray, Scored


def arima_in_window(
    engine: LeastSquaresArima, fitted: Fitted, hist: FloatArray, origins: IntArray, steps: int
) -> FloatArray:
    """ARIMA rolled from every origin of every series at once: (n, origins, steps)."""
    n, o = hist.shape[0], origins.size
    p, d = engine.p, engine.d
    z = np.diff(hist, n=d, axis=1) if d else hist
    lags = z[:, (origins[:, None] - d) - np.arange(p)[None, :]].reshape(n * o, p)
    rep = Fitted(
        intercept=np.repeat(fitted.intercept, o),
        phi=np.repeat(fitted.phi, o, axis=0),
        sigma2=np.repeat(fitted.sigma2, o),
    )
    zmean = np.repeat(nanmean_rows(z), o)
    last_at = hist[:, origins].reshape(-1)
    out: FloatArray = engine.roll(rep, lags, last_at, zmean, steps).reshape(n, o, steps)
    return out


def score(a: Assessment, newest: float) -> list[Scored]:
    """One `Scored` per row of an assessment whose newest origin is at `newest`."""
    names = list(a.errors)
    table = np.stack([a.errors[k] for k in names], axis=1)  # (n, candidates)
    errors = [
        {k: v for k, v in zip(names, row, strict=True) if np.isfinite(v)} for row in table.tolist()
    ]
    methods = [choose_method(e) if "last_value" in e else None for e in errors]
    last = np.array([m == "last_value" for m in methods])
    # Only the chosen method's errors are kept: one sort (NaN last), not one per candidate.
    chosen = np.where(last[:, None, None], a.residuals["last_value"], a.residuals["ensemble"])
    recent = np.abs(chosen)
    ordered = np.sort(recent.swapaxes(1, 2), axis=2).swapaxes(1, 2)  # sort rows
    peak_errors = np.where(last[:, None], a.peak_errors["last_value"], a.peak_errors["ensemble"])
    peaks = peak_offset(peak_errors)
    raw = np.stack([a.raw_weights[m] for m in MEMBERS], axis=1).tolist()
    return [
        Scored(
            method=methods[r],
            weights=tuple(raw[r]),
            errors=errors[r],
            ses_best=int(a.ses_best[r]),
            ses_inv=a.ses_inv[:, r].copy(),
            abs_errors=ordered[r],
            peak=float(peaks[r]),
            abs_recent=recent[r],
            peak_recent=peak_errors[r],
            newest=newest,
        )
        for r in range(table.shape[0])
    ]


def refresh(
    engine: LeastSquaresArima,
    fitted: Fitted,
    hist: FloatArray,
    scored: Sequence[Scored],
    usable: BoolArray,
    now: float,
    step: float,
    tape: SmoothingLevels | None = None,
) -> list[Scored]:
    """Each kept scoring with the chosen method's errors at the in-window origins completed
    since it was made (every ORIGIN_SPACING-th step, as `assess` spaces them), rolled with
    the kept coefficients and weights: the interval and the peak offset follow the load
    between refits at the cost of one origin per tick, not ASSESS_ORIGINS. `tape`: the
    smoothing levels of these rows, shared with the live paths."""
    levels_of: SmoothingLevels = tape if tape is not None else SesTape(hist)
    steps = scored[0].abs_recent.shape[1]
    spacing = max(1, steps // ORIGIN_SPACING) * step
    last_complete = now - steps * step  # an origin whose whole horizon is observed
    out = list(scored)
    groups: dict[float, list[int]] = {}
    for i, s in enumerate(scored):
        groups.setdefault(s.newest, []).append(i)
    for newest, idx in groups.items():
        times = newest + spacing * np.arange(1, int((last_complete - newest) / spacing + 1e-9) + 1)
        js = hist.shape[1] - 1 - np.round((now - times) / step).astype(np.int64)
        ok = js >= max(engine.p + engine.d + 2, WINDOW_MEAN_POINTS)
        if not ok.any():
            continue
        rows = np.array(idx)
        part = Fitted(fitted.intercept[rows], fitted.phi[rows], fitted.sigma2[rows])
        sub = [scored[i] for i in idx]

        def levels(j: int, rows: IntArray = rows) -> FloatArray:
            return levels_of.at(j)[:, rows]

        errors, peaks = _errors_at(
            engine, part, hist[rows], sub, usable[rows], js[ok], steps, levels
        )
        for i, rolled in zip(idx, _rolled(sub, errors, peaks, float(times[ok][-1])), strict=True):
            out[i] = rolled
    return out


def _rolled(
    sub: Sequence[Scored], errors: FloatArray, peaks: FloatArray, newest: float
) -> list[Scored]:
    """Kept scorings with the errors at the new origins appended (the oldest beyond
    ASSESS_ORIGINS dropped), their sorted errors and peak offsets updated. Rows of one
    shape are done at once (issue 18): the same per-row arithmetic as one at a time."""
    if len({(x.abs_recent.shape, x.peak_recent.shape) for x in sub}) == 1:
        recent = np.concatenate([np.stack([x.abs_recent for x in sub]), errors], axis=1)
        peak_recent = np.concatenate([np.stack([x.peak_recent for x in sub]), peaks], axis=1)
        recent, peak_recent = recent[:, -ASSESS_ORIGINS:], peak_recent[:, -ASSESS_ORIGINS:]
        ordered, offsets = np.sort(recent, axis=1), peak_offset(peak_recent).tolist()
        return [
            _with_errors(s, ordered[g], offsets[g], recent[g], peak_recent[g], newest)
            for g, s in enumerate(sub)
        ]
    out = []
    for g, s in enumerate(sub):
        recent_one = np.concatenate([s.abs_recent, errors[g]])[-ASSESS_ORIGINS:]
        peak_one = np.concatenate([s.peak_recent, peaks[g]])[-ASSESS_ORIGINS:]
        peak = float(peak_offset(peak_one[None, :])[0])
        out.append(_with_errors(s, np.sort(recent_one, axis=0), peak, recent_one, peak_one, newest))
    return out


def _with_errors(
    s: Scored,
    abs_errors: FloatArray,
    peak: float,
    abs_recent: FloatArray,
    peak_recent: FloatArray,
    newest: float,
) -> Scored:
    """`s` with its recent errors rolled on (`dataclasses.replace` without its per-call
    field walk: called for every series at every tick)."""
    return Scored(
        s.method,
        s.weights,
        s.errors,
        s.ses_best,
        s.ses_inv,
        abs_errors,
        peak,
        abs_recent,
        peak_recent,
        newest,
    )


def _errors_at(
    engine: LeastSquaresArima,
    fitted: Fitted,
    hist: FloatArray,
    scored: Sequence[Scored],
    usable: BoolArray,
    origins: IntArray,
    steps: int,
    levels: Callable[[int], FloatArray],
) -> tuple[FloatArray, FloatArray]:
    """The chosen method's absolute errors (n, origins, steps) and peak errors (n, origins)
    at `origins` (indexes into `hist`, whole horizon observed); `levels(j)`: the smoothing
    levels (alphas, n) at origin j."""
    n = hist.shape[0]
    ensemble = np.array([s.method == "ensemble" for s in scored])
    raw = {m: np.array([s.weights[i] for s in scored]) for i, m in enumerate(MEMBERS)}
    best = np.array([s.ses_best for s in scored], dtype=np.int64)
    inv = np.stack([s.ses_inv for s in scored], axis=1)
    arima = np.where(
        usable[:, None, None], arima_in_window(engine, fitted, hist, origins, steps), np.nan
    )
    errors, peaks = np.empty((n, origins.size, steps)), np.empty((n, origins.size))
    for c, j in enumerate(origins.tolist()):
        flat = smoothing_live(levels(j), best, inv)
        flat["window_mean"] = window_means(hist, np.array([j]), WINDOW_MEAN_POINTS)[:, 0]
        members = {k: np.repeat(v[:, None], steps, axis=1) for k, v in flat.items()}
        members["arima"] = arima[:, c, :]
        mixed = combine(normalized(raw, members), members)
        path = np.where(ensemble[:, None], mixed, hist[:, j][:, None])
        actual = hist[:, j + 1 : j + 1 + steps]
        errors[:, c] = np.abs(actual - path)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            peaks[:, c] = np.nanmax(actual, axis=1) - np.nanmax(path, axis=1)
    return errors, peaks


def live_paths(
    hist: FloatArray,
    scored: Sequence[Scored],
    arima: FloatArray,
    usable: BoolArray,
    steps: int,
    smoothed: FloatArray | None = None,
) -> tuple[dict[str, FloatArray], dict[str, FloatArray]]:
    """Every member's path (n, steps) at the live origin with the kept smoothing weights,
    the ensemble (kept weights, over the members with a finite path) and the last value;
    and the weights (n,) per member, normalized over those members. `smoothed`: the
    smoothing levels at the live origin (alphas, n), when already found."""
    levels = smoothing_live(
        ses_last(hist) if smoothed is None else smoothed,
        np.array([s.ses_best for s in scored], dtype=np.int64),
        np.stack([s.ses_inv for s in scored], axis=1),
    )
    end = np.array([hist.shape[1] - 1])
    levels["window_mean"] = window_means(hist, end, WINDOW_MEAN_POINTS)[:, 0]
    levels["last_value"] = last_finite(hist)
    live = {k: np.repeat(v[:, None], steps, axis=1) for k, v in levels.items()}
    live["arima"] = np.where(usable[:, None], arima, np.nan)
    raw = {m: np.array([s.weights[i] for s in scored]) for i, m in enumerate(MEMBERS)}
    weights = normalized(raw, live)
    live["ensemble"] = combine(weights, live)
    return live, weights


def half_widths(scored: Sequence[Scored], levels: FloatArray) -> FloatArray:
    """The conformal half width (n, steps) of each row's chosen method at its level, from
    the kept sorted errors (rows scored at different refits may hold different numbers
    of origins: the shorter are padded with NaN, which the rank ignores)."""
    depths = [s.abs_errors.shape[0] for s in scored]
    depth, steps = max(depths), scored[0].abs_errors.shape[1]
    if min(depths) == depth:  # the usual case: one stack, no padding
        return ranked_half_width(np.stack([s.abs_errors for s in scored]), levels)
    ordered = np.full((len(scored), depth, steps), np.nan)
    for r, s in enumerate(scored):
        ordered[r, : s.abs_errors.shape[0]] = s.abs_errors
    return ranked_half_width(ordered, levels)


def clip_rows(
    mean: FloatArray,
    lower: FloatArray,
    upper: FloatArray,
    offset: Sequence[float],
    clip: tuple[float, float | None],
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """Paths and intervals (n, steps) inside `clip`, and the peak offsets (n,) that keep each
    row's peak (path maximum + `offset`) inside it."""
    lo, hi = clip
    offsets = np.array(offset, dtype=np.float64)
    peak = np.clip(mean.max(axis=1) + offsets, lo, hi)
    clipped_mean = np.clip(mean, lo, hi)
    peak_error = np.where(np.isfinite(peak), peak - clipped_mean.max(axis=1), offsets)
    return clipped_mean, np.clip(lower, lo, hi), np.clip(upper, lo, hi), peak_error


def _scoring(b: Batch, model: Model, tape: SesTape | None = None) -> list[Scored | None]:
    """Each row's ensemble scoring: kept from the previous tick while its coefficients
    are (the state reused as is), made afresh for the rows refitted now, without a key
    or with `rescore`; None where there is too little history to score."""
    assert isinstance(b.engine, LeastSquaresArima) and model.fitted is not None
    out: list[Scored | None] = [
        None if b.rescore or key is None else _kept(b, key) for key in b.keys
    ]
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
    f, rows = model.fitted, np.array(kept)
    part = Fitted(f.intercept[rows], f.phi[rows], f.sigma2[rows])
    old = [s for s in (out[r] for r in kept) if s is not None]
    hist, usable = b.hist[rows], model.usable[rows]
    rows_tape = tape.rows(rows) if tape is not None else None
    new = refresh(b.engine, part, hist, old, usable, b.now, b.cfg.fit_step, rows_tape)
    for r, sc in zip(kept, new, strict=True):
        out[r] = sc


def _kept(b: Batch, key: str) -> Scored | None:
    """The scoring kept on the series' state, if its coefficients were not refitted now."""
    state = b.states.get(key)
    if state is None or key not in b.prior or state is not b.prior[key]:
        return None
    if state.scored is not None and state.scored.abs_errors.shape[1] != b.steps:
        return None  # scored for another horizon (the config changed): score again
    return state.scored


_LABELS = {
    "arima": "",
    "ses": "smoothing",
    "ses_avg": "averaged smoothing",
    "window_mean": "window mean",
}


def _reason(
    b: Batch,
    model: Model,
    member_weights: Mapping[str, float],
    alpha: float,
    r: int,
    method: str,
    errors: Mapping[str, float],
) -> str:
    name = b.engine.name
    weights = ", ".join(
        f"{name if m == 'arima' else _LABELS[m]} {member_weights[m]:.2f}" for m in MEMBERS
    )
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
