"""A batch's forecasts put together from its paths, scorings and interval states, every
row at once where the arithmetic is per element (issue 18): the chosen path, the
conformal half width, the bounds, the clip and the peak offset are filled into (n, steps)
arrays and each `Forecast` is made once; only the reasons are written row by row."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import groupby, repeat
from operator import attrgetter
from typing import Any

import numpy as np

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast.engines import Fitted, ForecastEngine, PathBatch, last_finite
from gpuscaler.core.forecast.ensemble import FALLBACK_MARGIN, MEMBERS, SES_ALPHAS, SesTape
from gpuscaler.core.forecast.intervals import coverage_text, naive_half_width
from gpuscaler.core.forecast.made import Reason
from gpuscaler.core.forecast.made import forecast as made_forecast
from gpuscaler.core.forecast.scored import clip_rows, half_widths, live_paths
from gpuscaler.core.model import (
    BoolArray,
    FitState,
    FloatArray,
    Forecast,
    Scored,
)


@dataclass(frozen=True, eq=False)
class Batch:
    """Series forecast together: one config, their bucketed windows (n, t) and keys."""

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
    clips: Sequence[tuple[float, float | None]] | None = None
    """Each row's own clip, when not all `clip`."""


@dataclass(frozen=True, eq=False)
class Model:
    """The engine's paths and which rows may be used, with why not."""

    paths: PathBatch
    fitted: Fitted | None
    usable: BoolArray
    dropped: list[str | None]


@dataclass(frozen=True, eq=False)
class _Rows:
    """Every row's path and interval (n, steps) before the clip, and what describes it."""

    mean: FloatArray
    half: FloatArray
    method: list[str]
    reason: list[str | Reason]
    """Each row's reason, or how to make it when read (`made.forecast`)."""
    last: list[float]
    errors: list[Mapping[str, float]]
    peak: list[float]


Adaptive = tuple[Sequence[float], Sequence[int], Sequence[int]]
"""Each row's adaptive interval level, points checked and misses so far (`check_rows`;
the nominal level, 0, 0 for a row without a state)."""


def assembled(
    b: Batch,
    model: Model,
    scored: Sequence[Scored | None],
    adaptive: Adaptive,
    tape: SesTape | None = None,
) -> tuple[list[Forecast], list[bool], FloatArray, FloatArray]:
    """Every row's forecast, clipped to `b.clip`: from its scoring (the kept weights on the
    members' live paths, the conformal interval at the row's adaptive level), or the
    engine's path (the last value when that path was dropped); whether each is finite
    (`Forecast.is_finite`, every row at once); the rows' lower and upper bounds (n, steps:
    the forecasts' arrays are their rows)."""
    n, steps = b.hist.shape[0], b.steps
    empty: list[Mapping[str, float]] = [{}] * n
    rows = _Rows(
        np.empty((n, steps)), np.empty((n, steps)), [""] * n, [""] * n, [0.0] * n, empty, [0.0] * n
    )
    lower, upper = np.empty((n, steps)), np.empty((n, steps))
    chosen = [r for r, s in enumerate(scored) if s is not None and s.method is not None]
    if chosen:
        at = _rows_of(chosen, n)  # every row: a view of the levels (the tape's own copy)
        smoothed = tape.at(b.hist.shape[1] - 1)[:, at] if tape is not None else None
        _from_scored(b, model, scored, adaptive, chosen, rows, smoothed)
        if isinstance(at, slice):  # every row: into the blocks, without a temporary
            np.subtract(rows.mean, rows.half, out=lower)
            np.add(rows.mean, rows.half, out=upper)
        else:
            lower[at] = rows.mean[at] - rows.half[at]
            upper[at] = rows.mean[at] + rows.half[at]
    picked = set(chosen) if len(chosen) < n else None  # None: every row scored
    plain = [r for r in range(n) if r not in picked] if picked is not None else []
    if plain:
        _plain(b, model, plain, rows, lower, upper)
    np.minimum(lower, rows.mean, out=lower)  # in place: each element as a fresh one
    np.maximum(upper, rows.mean, out=upper)
    mean, lower, upper, peak_error = _clipped(b, rows.mean, lower, upper, rows.peak)
    offsets = peak_error.tolist()
    finite: BoolArray = np.asarray(np.isfinite(mean).all(axis=1))
    finite &= np.isfinite(lower).all(axis=1) & np.isfinite(upper).all(axis=1)
    for block in (mean, lower, upper):
        block.flags.writeable = False  # each forecast's rows: what was found stays true
    ok: list[bool] = finite.tolist()
    forecasts = list(
        map(
            made_forecast,
            repeat(b.now),
            repeat(b.cfg.fit_step),
            mean,  # the blocks' rows (views made in C, as mean[r] is)
            lower,
            upper,
            repeat(b.cfg.interval_level),
            rows.method,
            rows.reason,
            rows.last,
            [e or {} for e in rows.errors],  # an empty one: each forecast its own dict
            offsets,
            ok,
        )
    )
    return forecasts, ok, lower, upper


def _clipped(
    b: Batch, mean: FloatArray, lower: FloatArray, upper: FloatArray, peak: list[float]
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """`clip_rows` with each row's clip: the rows of one clip together, each group as a
    batch of that clip alone (a clip without an upper bound is not one at +inf: `np.clip`
    makes a -0.0 0.0 without one, keeps it with +inf)."""
    clips = list(dict.fromkeys(b.clips)) if b.clips is not None else [b.clip]
    if len(clips) == 1:
        return clip_rows(mean, lower, upper, peak, clips[0])
    assert b.clips is not None
    out = [np.empty_like(mean), np.empty_like(lower), np.empty_like(upper)]
    offsets = np.empty(mean.shape[0])
    for clip, rows in _clip_rows(b.clips, clips):
        offset = peak[rows] if isinstance(rows, slice) else [peak[r] for r in rows]
        parts = clip_rows(mean[rows], lower[rows], upper[rows], offset, clip)
        for whole, part in zip((*out, offsets), parts, strict=True):
            whole[rows] = part
    return out[0], out[1], out[2], offsets


def _clip_rows(
    every: Sequence[tuple[float, float | None]], clips: list[tuple[float, float | None]]
) -> list[tuple[tuple[float, float | None], slice | list[int]]]:
    """Each of `clips` (the distinct ones of `every`) with its rows: a slice when they
    follow each other (issue 20: the pools, then the workloads), which reads views."""
    runs = [(clip, len(list(run))) for clip, run in groupby(every)]
    if len(runs) == len(clips):  # each clip's rows in one run
        ends = np.cumsum([size for _, size in runs]).tolist()
        return [
            (clip, slice(end - size, end)) for (clip, size), end in zip(runs, ends, strict=True)
        ]
    return [(clip, [r for r, c in enumerate(every) if c == clip]) for clip in clips]


def _plain(
    b: Batch, model: Model, plain: list[int], rows: _Rows, lower: FloatArray, upper: FloatArray
) -> None:
    """The rows `plain` from the engine's own path and interval, or the last value when the
    path was dropped; all at once (issue 18: a young window, too short to assess, takes
    this path for every series, and one row at a time cost ~1 ms of numpy calls a row).
    Each row's figures are those of the row alone (the arithmetic is per row)."""
    lasts = last_finite(b.hist[plain])
    usable: list[bool] = np.asarray(model.usable[plain]).tolist()
    name = b.engine.name
    fit_reason = f"{name} fit" + ("" if not b.cfg.ensemble else ", too little history to assess")
    engine_rows = [r for r, ok in zip(plain, usable, strict=True) if ok]
    if engine_rows:
        rows.mean[engine_rows] = model.paths.mean[engine_rows]
        lower[engine_rows] = model.paths.lower[engine_rows]
        upper[engine_rows] = model.paths.upper[engine_rows]
    dropped = [r for r, ok in zip(plain, usable, strict=True) if not ok]
    if dropped:
        half = naive_half_width(b.hist[dropped], b.steps, b.cfg.interval_level)
        flat = np.repeat(lasts[[not ok for ok in usable]][:, None], b.steps, axis=1)
        rows.mean[dropped] = flat
        lower[dropped], upper[dropped] = flat - half, flat + half
    for r, ok, last in zip(plain, usable, lasts.tolist(), strict=True):
        if ok:
            rows.reason[r], rows.method[r] = fit_reason, name
        else:
            rows.reason[r], rows.method[r] = f"last value: {model.dropped[r]}", "last_value"
        rows.last[r], rows.errors[r], rows.peak[r] = last, {}, 0.0


def _rows_of(chosen: list[int], n: int) -> slice | list[int]:
    """`chosen` (ascending rows of n) as an index: every row (the steady state) as a
    slice, which reads views and writes in place where a list gathers copies (issue 20:
    some 1.6 us a row a tick); the same values either way (the readers do not write)."""
    return slice(None) if len(chosen) == n else chosen


def _from_scored(
    b: Batch,
    model: Model,
    scored: Sequence[Scored | None],
    adaptive: Adaptive,
    chosen: list[int],
    rows: _Rows,
    smoothed: FloatArray | None,
) -> None:
    """The rows `chosen` (each with a scoring that names a method) from their scorings."""
    some = _rows_of(chosen, b.hist.shape[0])
    kept = [
        s
        for s in (scored if isinstance(some, slice) else map(scored.__getitem__, chosen))
        if s is not None
    ]
    methods: list[str] = list(map(_METHOD, kept))  # each names one (`chosen`)
    hist, arima, usable = b.hist[some], model.paths.mean[some], model.usable[some]
    live, weights = live_paths(hist, kept, arima, usable, smoothed)
    nominal = b.cfg.interval_level
    at, points, misses = adaptive
    levels = np.array(at if isinstance(some, slice) else [at[r] for r in chosen])
    halves = half_widths(kept, levels)
    short: list[bool] = np.asarray(~np.isfinite(halves).all(axis=1)).tolist()
    if "last_value" in methods:  # else every row the ensemble's (the where's values)
        last_value = np.array([m == "last_value" for m in methods])
        rows.mean[some] = np.where(last_value[:, None], live["last_value"], live["ensemble"])
    else:
        rows.mean[some] = live["ensemble"]
    lasts = live["last_value"][:, 0].tolist()
    rows.half[some] = halves
    fallback = [r for r, s in zip(chosen, short, strict=True) if s]
    if fallback:
        rows.half[fallback] = _fallback_halves(b, model, fallback)
    # the reasons are made when read (issue 20: most never are); the members' weights
    # formatted by one template a batch ('%.2f' writes a float as f"{x:.2f}" does)
    errors: list[Mapping[str, float]] = list(map(_ERRORS, kept))
    shares = [weights[m] for m in MEMBERS]  # (n,) each: a row's read when its reason is
    for share in shares:
        share.flags.writeable = False  # what the reasons will read stays as found
    name = b.engine.name
    batch = _ReasonRows(
        name,
        _weights_template(name),
        nominal,
        shares,
        list(map(_BEST, kept)),
        methods,
        errors,
        (model.dropped, at, points, misses),
    )
    reasons: list[str | Reason] = list(
        zip(repeat(_row_reason), zip(repeat(batch), chosen, range(len(chosen))))
    )
    _put(rows, chosen, (reasons, methods, lasts, errors, list(map(_PEAK, kept))))


_METHOD, _ERRORS, _PEAK, _BEST = (
    attrgetter("method"),
    attrgetter("errors"),
    attrgetter("peak"),
    attrgetter("ses_best"),
)


def _put(
    rows: _Rows,
    chosen: list[int],
    columns: tuple[
        list[str | Reason], list[str], list[float], list[Mapping[str, float]], list[float]
    ],
) -> None:
    """The rows `chosen`'s reasons, methods, last values, errors and peaks put in `rows`:
    each list replaced whole when they are every row (the steady state)."""
    targets: tuple[list[Any], ...] = (rows.reason, rows.method, rows.last, rows.errors, rows.peak)
    values: tuple[list[Any], ...] = columns
    every = len(chosen) == len(rows.method)
    for target, column in zip(targets, values, strict=True):
        if every:
            target[:] = column
        else:
            for r, value in zip(chosen, column, strict=True):
                target[r] = value


@dataclass(frozen=True, eq=False)
class _ReasonRows:
    """What a batch's scored rows' reasons are made from, one object a batch: each row's
    reason is `(_row_reason, (batch, row, its place among the scored rows))`."""

    name: str
    template: str
    nominal: float
    shares: list[FloatArray]
    """Each member's normalized weight (n,) over the scored rows."""
    best: list[int]
    methods: list[str]
    errors: list[Mapping[str, float]]
    adaptive: tuple[Sequence[str | None], Sequence[float], Sequence[int], Sequence[int]]
    """By row of the batch: why its engine's path was dropped, its adaptive level, points
    and misses."""


def _row_reason(batch: _ReasonRows, r: int, i: int) -> str:
    """Row r's reason, the i-th scored row of its batch (`_scored_reason`)."""
    dropped, level, points, misses = batch.adaptive
    return _scored_reason(
        batch.name,
        batch.template,
        [float(share[i]) for share in batch.shares],
        batch.best[i],
        dropped[r],
        batch.methods[i],
        batch.errors[i],
        batch.nominal,
        level[r],
        points[r],
        misses[r],
    )


def _scored_reason(
    name: str,
    template: str,
    shares: list[float],
    ses_best: int,
    dropped_why: str | None,
    method: str,
    errors: Mapping[str, float],
    nominal: float,
    level: float,
    points: int,
    misses: int,
) -> str:
    """A scored row's reason: the members' weights and scores, then how its interval's
    adaptive level stands (`coverage_text`)."""
    weights = template % tuple(shares)
    why = _reason(name, weights, SES_ALPHAS[ses_best], dropped_why, method, errors)
    return why + "; " + coverage_text(nominal, level, points, misses)


def _fallback_halves(b: Batch, model: Model, rows: list[int]) -> FloatArray:
    """Half widths (len(rows), steps) when too few recent errors: the model's, or the last
    value's; the rows at once, each as alone."""
    usable = model.usable[rows]
    out: FloatArray = model.paths.upper[rows] - model.paths.mean[rows]
    if not usable.all():
        naive = [r for r, ok in zip(rows, usable.tolist(), strict=True) if not ok]
        out[~usable] = naive_half_width(b.hist[naive], b.steps, b.cfg.interval_level)
    return out


_LABELS = {
    "arima": "",
    "ses": "smoothing",
    "ses_avg": "averaged smoothing",
    "window_mean": "window mean",
}


@cache
def _weights_template(name: str) -> str:
    """ "{name} %.2f, smoothing %.2f, ...": each member's label and its weight's place."""
    labels = [name if m == "arima" else _LABELS[m] for m in MEMBERS]
    return ", ".join(f"{label.replace('%', '%%')} %.2f" for label in labels)


def _reason(
    name: str,
    weights: str,
    alpha: float,
    dropped_why: str | None,
    method: str,
    errors: Mapping[str, float],
) -> str:
    arima = f"{errors['arima']:.2f}" if "arima" in errors else "-"
    ens = f"{errors['ensemble']:.2f}" if "ensemble" in errors else "-"
    scores = (
        f"recent error {ens} vs last value {errors['last_value']:.2f}, "
        f"window mean {errors.get('window_mean', np.nan):.2f}, {name} {arima}"
    )
    dropped = f"; {dropped_why}" if dropped_why else ""
    if method == "ensemble":
        return (
            f"ensemble weighted by recent error ({weights}; smoothing alpha "
            f"{alpha:.2f}): {scores}{dropped}"
        )
    return (
        f"last_value: beats the ensemble ({ens}) by over {FALLBACK_MARGIN:.0%} on recent "
        f"data; {scores}{dropped}"
    )
