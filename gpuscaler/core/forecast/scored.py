"""What only changes at a refit, kept per series until the next one (issue 18).

Scoring the ensemble (every member at up to ASSESS_ORIGINS in-window origins over the
horizon) is most of a forecast's cost, yet its results (the members' weights, the
choice between the ensemble and the last value, the recent errors, the conformal
errors and the peak offset) are made when the coefficients are refitted
(`forecast.refit_every`). They ride on the series' `FitState` as a `Scored`; a steady
tick only computes the members' live paths, combines them with the kept weights and
takes the conformal quantile at the current adaptive level from the kept, sorted errors.
Those errors (and the peak errors) are updated incrementally (`refresh`): each in-window
origin completed since is scored with the kept coefficients and weights, the oldest
dropped. `clip_rows` bounds every forecast of a batch at once.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import numpy as np

from gpuscaler.core.forecast.blocks import as_rows, stacked
from gpuscaler.core.forecast.engines import Fitted, LeastSquaresArima, last_finite
from gpuscaler.core.forecast.ensemble import (
    ASSESS_ORIGINS,
    MEMBERS,
    ORIGIN_SPACING,
    WINDOW_MEAN_POINTS,
    Assessment,
    SesTape,
    SmoothingLevels,
    arima_in_window,
    choose_method,
    combine,
    normalized,
    ses_last,
    smoothing_live,
    window_means,
)
from gpuscaler.core.forecast.intervals import peak_offset, ranked_half_width
from gpuscaler.core.forecast.made import scored as made_scored
from gpuscaler.core.model import BoolArray, FloatArray, IntArray, Scored


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
    ordered = np.sort(recent.swapaxes(1, 2), axis=2)  # (n, steps, origins): sort rows
    peak_errors = np.where(last[:, None], a.peak_errors["last_value"], a.peak_errors["ensemble"])
    peaks = peak_offset(peak_errors)
    raw = np.stack([a.raw_weights[m] for m in MEMBERS], axis=1).tolist()
    # each row's arrays are rows of the batch's (issue 20: read back without a stack)
    inv, sorted_rows = as_rows(a.ses_inv.T.copy()), as_rows(ordered, True)
    recent_rows, peak_rows = as_rows(recent), as_rows(peak_errors)
    return [
        Scored(
            method=methods[r],
            weights=tuple(raw[r]),
            errors=errors[r],
            ses_best=int(a.ses_best[r]),
            ses_inv=inv[r],
            abs_errors=sorted_rows[r],
            peak=float(peaks[r]),
            abs_recent=recent_rows[r],
            peak_recent=peak_rows[r],
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
        # (n, steps, origins): each row's errors at a step contiguous, sorted along them
        kept = stacked([x.abs_recent for x in sub]).swapaxes(1, 2)
        drop = max(0, kept.shape[2] + errors.shape[1] - ASSESS_ORIGINS)
        recent = np.concatenate([kept[:, :, drop:], errors.swapaxes(1, 2)], axis=2)
        kept_peaks = stacked([x.peak_recent for x in sub])
        drop = max(0, kept_peaks.shape[1] + peaks.shape[1] - ASSESS_ORIGINS)
        peak_recent = np.concatenate([kept_peaks[:, drop:], peaks], axis=1)
        ordered, offsets = np.sort(recent, axis=2), peak_offset(peak_recent).tolist()
        rows = zip(as_rows(ordered, True), as_rows(recent, True), as_rows(peak_recent), strict=True)
        return [
            _with_errors(s, sorted_row, offsets[g], recent_row, peak_row, newest)
            for g, (s, (sorted_row, recent_row, peak_row)) in enumerate(zip(sub, rows, strict=True))
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
    return made_scored(
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
    raw = dict(zip(MEMBERS, np.array([s.weights for s in scored]).T, strict=True))
    best = np.array([s.ses_best for s in scored], dtype=np.int64)
    inv = stacked([s.ses_inv for s in scored]).T
    arima = np.where(
        usable[:, None, None], arima_in_window(engine, fitted, hist, origins, steps), np.nan
    )
    errors, peaks = np.empty((n, origins.size, steps)), np.empty((n, origins.size))
    means = window_means(hist, origins, WINDOW_MEAN_POINTS)  # one running sum, every origin
    for c, j in enumerate(origins.tolist()):
        flat = smoothing_live(levels(j), best, inv)
        flat["window_mean"] = means[:, c]
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
        stacked([s.ses_inv for s in scored]).T,
    )
    end = np.array([hist.shape[1] - 1])
    levels["window_mean"] = window_means(hist, end, WINDOW_MEAN_POINTS)[:, 0]
    levels["last_value"] = last_finite(hist)
    live = {k: np.repeat(v[:, None], steps, axis=1) for k, v in levels.items()}
    live["arima"] = np.where(usable[:, None], arima, np.nan)
    raw = dict(zip(MEMBERS, np.array([s.weights for s in scored]).T, strict=True))
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
        return ranked_half_width(stacked([s.abs_errors for s in scored]), levels)
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
