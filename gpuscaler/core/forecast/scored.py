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

from collections.abc import Sequence
from math import isfinite

import numpy as np

from gpuscaler.core.forecast import kept_rows, strips
from gpuscaler.core.forecast.blocks import as_rows, block_of, stacked
from gpuscaler.core.forecast.engines import Fitted, LeastSquaresArima, last_finite
from gpuscaler.core.forecast.ensemble import (
    ASSESS_ORIGINS,
    MEMBERS,
    ORIGIN_SPACING,
    WINDOW_MEAN_POINTS,
    Assessment,
    SesTape,
    SmoothingLevels,
    arima_at,
    choose_method,
    combine,
    normalized,
    ses_last,
    smoothing_live,
    window_means,
)
from gpuscaler.core.forecast.intervals import peak_offset, ranked_half_width
from gpuscaler.core.forecast.kept_rows import KeptRows
from gpuscaler.core.forecast.made import scored as made_scored
from gpuscaler.core.model import BoolArray, FloatArray, IntArray, Scored


def score(a: Assessment, newest: float) -> list[Scored]:
    """One `Scored` per row of an assessment whose newest origin is at `newest`."""
    names = list(a.errors)
    table = np.stack([a.errors[k] for k in names], axis=1)  # (n, candidates)
    errors = [
        {k: v for k, v in zip(names, row, strict=True) if isfinite(v)} for row in table.tolist()
    ]
    methods = [choose_method(e) if "last_value" in e else None for e in errors]
    last = np.array([m == "last_value" for m in methods])
    # Only the chosen method's errors are kept: one sort (NaN last), not one per candidate.
    chosen = np.where(last[:, None, None], a.residuals["last_value"], a.residuals["ensemble"])
    recent = np.abs(chosen, out=chosen)  # a fresh array: no second one
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
    smoothing levels of these rows, shared with the live paths.

    Every row's new origins are scored together (issue 20: rows refitted at different
    ticks have their origins on other phases of the spacing; they were one group each,
    and one pass of the scoring per origin), as pairs of (row, origin)."""
    levels_of: SmoothingLevels = tape if tape is not None else SesTape(hist)
    steps = scored[0].abs_recent.shape[1]
    rows, counts, newest, js = _new_origins(engine, hist.shape[1], scored, now, step, steps)
    out = list(scored)
    if not rows:
        return out
    fixed = kept_rows.of(scored)
    pair_rows = np.repeat(np.array(rows), counts)
    origins = np.array(js, dtype=np.int64)
    ends, at = np.unique(origins, return_inverse=True)
    levels = levels_of.many(ends)[at, :, pair_rows].T  # (alphas, pairs)
    means = window_means(hist, ends, WINDOW_MEAN_POINTS)[pair_rows, at]
    errors, peaks = _errors_at(
        engine, fitted, hist, fixed, usable, pair_rows, origins, levels, means, steps
    )
    sub = [scored[i] for i in rows]
    for i, rolled in zip(rows, _rolled(sub, errors, peaks, counts, newest), strict=True):
        out[i] = rolled
    kept_rows.carried(out, fixed)  # the rolled scorings keep their refits' fields
    return out


def _new_origins(
    engine: LeastSquaresArima,
    t: int,
    scored: Sequence[Scored],
    now: float,
    step: float,
    steps: int,
) -> tuple[list[int], list[int], list[float], list[int]]:
    """The rows with in-window origins completed since their scorings' `newest`, in order;
    how many each, each row's newest origin time, and the origins (indexes into the window
    of `t` points) row after row. Found once for each `newest` (rows scored at one refit
    share it)."""
    spacing = max(1, steps // ORIGIN_SPACING) * step
    last_complete = now - steps * step  # an origin whose whole horizon is observed
    lowest = max(engine.p + engine.d + 2, WINDOW_MEAN_POINTS)
    found: dict[float, tuple[list[int], float] | None] = {}
    rows: list[int] = []
    counts: list[int] = []
    newest: list[float] = []
    js: list[int] = []
    for i, s in enumerate(scored):
        if s.newest not in found:
            found[s.newest] = _origins_after(s.newest, spacing, last_complete, now, step, t, lowest)
        new = found[s.newest]
        if new is not None:
            rows.append(i)
            counts.append(len(new[0]))
            newest.append(new[1])
            js += new[0]
    return rows, counts, newest, js


def _origins_after(
    first: float, spacing: float, last_complete: float, now: float, step: float, t: int, lowest: int
) -> tuple[list[int], float] | None:
    """The origins (indexes, at or after `lowest`) every `spacing` after `first` up to
    `last_complete`, and the newest one's time; None if there is none."""
    times = first + spacing * np.arange(1, int((last_complete - first) / spacing + 1e-9) + 1)
    js = t - 1 - np.round((now - times) / step).astype(np.int64)
    ok = js >= lowest
    if not ok.any():
        return None
    return js[ok].tolist(), float(times[ok][-1])


def _rolled(
    sub: Sequence[Scored],
    errors: FloatArray,
    peaks: FloatArray,
    counts: Sequence[int],
    newest: Sequence[float],
) -> list[Scored]:
    """Kept scorings with the errors at their new origins appended (the oldest beyond
    ASSESS_ORIGINS dropped), their sorted errors and peak offsets updated: `errors`
    (pairs, steps) and `peaks` (pairs,) row after row, `counts[g]` of them for row g, whose
    newest origin is then at `newest[g]`. Rows that hold as many errors before and after
    are done at once whatever their counts (every row once it holds ASSESS_ORIGINS;
    issues 18 and 20): the same per-row arithmetic as one at a time."""
    recent, peak_rows = [s.abs_recent for s in sub], [s.peak_recent for s in sub]
    if _one_group(recent, peak_rows, counts):  # the steady lanes: no per-row grouping
        return _rolled_together(sub, recent, peak_rows, errors, peaks, counts, newest)
    groups: dict[tuple[tuple[int, ...], tuple[int, ...], int], list[int]] = {}
    for g, s in enumerate(sub):
        after = min(s.peak_recent.shape[0] + counts[g], ASSESS_ORIGINS)
        groups.setdefault((s.abs_recent.shape, s.peak_recent.shape, after), []).append(g)
    if len(groups) == 1:
        return _rolled_together(sub, recent, peak_rows, errors, peaks, counts, newest)
    out: list[Scored] = list(sub)
    starts = np.cumsum([0, *counts]).tolist()
    for idx in groups.values():
        pairs = np.concatenate([np.arange(starts[g], starts[g + 1]) for g in idx])
        part = _rolled_together(
            [sub[g] for g in idx],
            [recent[g] for g in idx],
            [peak_rows[g] for g in idx],
            errors[pairs],
            peaks[pairs],
            [counts[g] for g in idx],
            [newest[g] for g in idx],
        )
        for g, rolled in zip(idx, part, strict=True):
            out[g] = rolled
    return out


def _one_group(
    recent: Sequence[FloatArray], peak_rows: Sequence[FloatArray], counts: Sequence[int]
) -> bool:
    """Whether `_rolled` makes one group of the rows of these recent and peak errors: one
    shape of each (rows of one kept window or block; else their shapes compared), and as
    many after for each (equal counts, or ASSESS_ORIGINS for all) (issue 20: not a key
    made row by row)."""
    if block_of(peak_rows) is None and len({p.shape for p in peak_rows}) != 1:
        return False
    loose = strips.window_of(recent) is None and block_of(recent) is None
    if loose and len({r.shape for r in recent}) != 1:
        return False
    least = min(counts)
    return least == max(counts) or peak_rows[0].shape[0] + least >= ASSESS_ORIGINS


def _rolled_together(
    sub: Sequence[Scored],
    recent_kept: Sequence[FloatArray],
    peak_rows: Sequence[FloatArray],
    errors: FloatArray,
    peaks: FloatArray,
    counts: Sequence[int],
    newest: Sequence[float],
) -> list[Scored]:
    """`_rolled` of rows of one shape that hold as many errors after as each other;
    `recent_kept` and `peak_rows`: their recent errors (origins, steps) and peak errors."""
    n, depth, steps = len(sub), peak_rows[0].shape[0], errors.shape[1]
    after = min(depth + counts[0], ASSESS_ORIGINS)
    kept_peaks = stacked(peak_rows)
    if min(counts) == max(counts):  # the new errors (n, k, ...) as they come
        k = counts[0]
        old, young = _dropped(depth, k, after)
        new, new_peaks = errors.reshape(n, k, steps), peaks.reshape(n, k)
        recent_rows = strips.rolled(recent_kept, old, new[:, young:].swapaxes(1, 2))
        recent = strips.kept(recent_rows)
        peak_recent = np.concatenate([kept_peaks[:, old:], new_peaks[:, young:]], axis=1)
    else:  # the rows of each count moved together (whole rows: 1 and 2 in the lanes)
        kept = strips.kept(recent_kept)
        recent, peak_recent = np.empty((n, steps, after)), np.empty((n, after))
        count_of, starts = np.array(counts), np.cumsum([0, *counts[:-1]])
        for k in sorted(set(counts)):
            rows = np.flatnonzero(count_of == k)
            old, young = _dropped(depth, k, after)
            pairs = starts[rows][:, None] + np.arange(young, k)[None, :]
            recent[rows, :, : depth - old] = kept[rows, :, old:]
            recent[rows, :, depth - old :] = errors[pairs].swapaxes(1, 2)
            peak_recent[rows, : depth - old] = kept_peaks[rows, old:]
            peak_recent[rows, depth - old :] = peaks[pairs]
        recent_rows = as_rows(recent, True)
    ordered, offsets = np.sort(recent, axis=2), peak_offset(peak_recent).tolist()
    sorted_rows, peak_out = as_rows(ordered, True), as_rows(peak_recent)
    rows_of = zip(sub, sorted_rows, offsets, recent_rows, peak_out, newest, strict=True)
    # each `s` with its recent errors rolled on: `dataclasses.replace` without its per-call
    # field walk (called for every series at every tick), one call a row
    return [
        made_scored(s.method, s.weights, s.errors, s.ses_best, s.ses_inv, a, p, r, pr, t)
        for s, a, p, r, pr, t in rows_of
    ]


def _dropped(depth: int, k: int, after: int) -> tuple[int, int]:
    """How many of a row's `depth` kept and of its `k` new values go, to keep `after`."""
    drop = depth + k - after  # beyond `depth` when more new than kept at most
    return min(drop, depth), max(0, drop - depth)


def _errors_at(
    engine: LeastSquaresArima,
    fitted: Fitted,
    hist: FloatArray,
    fixed: KeptRows,
    usable: BoolArray,
    rows: IntArray,
    origins: IntArray,
    levels: FloatArray,
    means: FloatArray,
    steps: int,
) -> tuple[FloatArray, FloatArray]:
    """The chosen method's absolute errors (pairs, steps) and peak errors (pairs,) of row
    `rows[i]` at origin `origins[i]` (an index into `hist`, whole horizon observed), every
    pair at once (issue 20: was one pass a group of rows and origin); `levels`: the
    smoothing levels (alphas, pairs) and `means` the window means (pairs,) there. The
    same per-row arithmetic: each pair's figures are those of its row and origin alone;
    `fixed`: the rows' kept fields from their refits."""
    ensemble = fixed.ensemble[rows]
    raw = dict(zip(MEMBERS, fixed.weights[rows].T, strict=True))
    members = smoothing_live(levels, fixed.best[rows], fixed.inv[rows].T)
    members["window_mean"] = means
    members = {k: v[:, None] for k, v in members.items()}  # flat: (pairs, 1), broadcast
    arima = arima_at(engine, fitted, hist, rows, origins, steps)
    members["arima"] = np.where(usable[rows][:, None], arima, np.nan)
    mixed = combine(normalized(raw, members), members)
    path = np.where(ensemble[:, None], mixed, hist[rows, origins][:, None])
    actual = hist[rows[:, None], origins[:, None] + np.arange(1, steps + 1)[None, :]]
    # np.nanmax's own reduction (NaN where a row has none), without its warning machinery
    with np.errstate(all="ignore"):
        peaks = np.fmax.reduce(actual, axis=1) - np.fmax.reduce(path, axis=1)
    errors: FloatArray = np.abs(actual - path)
    return errors, peaks


def live_paths(
    hist: FloatArray,
    scored: Sequence[Scored],
    arima: FloatArray,
    usable: BoolArray,
    smoothed: FloatArray | None = None,
) -> tuple[dict[str, FloatArray], dict[str, FloatArray]]:
    """Every member's path at the live origin with the kept smoothing weights, the
    ensemble (kept weights, over the members with a finite path) and the last value; and
    the weights (n,) per member, normalized over those members. `smoothed`: the
    smoothing levels at the live origin (alphas, n), when already found. ARIMA's path and
    the ensemble are (n, steps); the flat members (the smoothing, the window mean, the last
    value) one column (n, 1), which `normalized` and `combine` broadcast with the same
    arithmetic at every point (issue 20: they were repeated to (n, steps) first)."""
    fixed = kept_rows.of(scored)
    levels = smoothing_live(
        ses_last(hist) if smoothed is None else smoothed, fixed.best, fixed.inv.T
    )
    end = np.array([hist.shape[1] - 1])
    levels["window_mean"] = window_means(hist, end, WINDOW_MEAN_POINTS)[:, 0]
    levels["last_value"] = last_finite(hist)
    live = {k: v[:, None] for k, v in levels.items()}
    live["arima"] = np.where(usable[:, None], arima, np.nan)
    raw = dict(zip(MEMBERS, fixed.weights.T, strict=True))
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
