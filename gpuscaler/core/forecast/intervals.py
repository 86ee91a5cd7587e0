"""Prediction intervals and the peak: split-conformal from the recent absolute errors at
each step, an adaptive correction carried across ticks per series, and the peak's offset.

Conformal: with n recent absolute errors at a step, the half width at level L is the
ceil((n + 1) L)-th smallest (the small-sample rank correction; the largest when that
rank exceeds n). Adaptive conformal inference (Gibbs & Candes 2021, "Adaptive conformal
inference under distribution shift"): each tick, the points observed since the last one
are checked against the intervals issued before; the level moves by ACI_GAMMA times
(miss rate - (1 - nominal)), so a series whose intervals miss too often gets wider ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, repeat

import numpy as np

from gpuscaler.core.forecast.blocks import as_rows, stacked
from gpuscaler.core.forecast.by_identity import ByIdentity
from gpuscaler.core.forecast.made import interval_state
from gpuscaler.core.forecast.widths import (
    MIN_RESIDUALS,
    PEAK_QUANTILE,
    conformal_half_width,
    naive_half_width,
    peak_offset,
    ranked_half_width,
)
from gpuscaler.core.model import FloatArray, IntArray, IntervalState, IssuedInterval

__all__ = [  # the half widths and the peak's offset are `widths`' (named here as before)
    "ACI_GAMMA",
    "ACI_LEVELS",
    "MIN_RESIDUALS",
    "PEAK_QUANTILE",
    "Checked",
    "check_rows",
    "conformal_half_width",
    "coverage_note",
    "coverage_text",
    "issue",
    "issue_checked",
    "issue_rows",
    "naive_half_width",
    "peak_offset",
    "ranked_half_width",
    "reissue",
    "resolve",
    "resolve_rows",
]

ACI_GAMMA = 0.1
"""Step of the adaptive level per tick. Each tick's miss rate pools the points of up to a
horizon's worth of issued intervals, and a series may have only a few hundred ticks (1 h
at 10 s): 0.02 and 0.05 left the 2023 traces' coverage 0.04-0.06 off nominal, 0.1 within
0.03 (bench/forecast_quality.py; Gibbs & Candes use 0.005 on far longer sequences)."""
ACI_LEVELS = (0.05, 0.995)
"""The adaptive level stays inside these bounds."""


def resolve(
    state: IntervalState | None, row: FloatArray, now: float, step: float, nominal: float
) -> IntervalState:
    """The adaptive state after checking every point observed since `state.checked_at`
    against the intervals issued before; `row` is the bucketed window ending at `now`.
    The result's `checked_at` is `now`; its pending intervals are those not yet fully
    observed (`resolve_rows` of one row)."""
    return resolve_rows([state], row[None, :], now, step, nominal)[0]


def resolve_rows(
    states: Sequence[IntervalState | None],
    hist: FloatArray,
    now: float,
    step: float,
    nominal: float,
) -> list[IntervalState]:
    """`resolve` of each row of `hist` (n, t) with its state (None: a fresh one). The rows
    whose pending intervals have one layout (the series of a batch, issued at the same
    ticks) are checked together (issue 18: one series at a time cost about 0.2 ms a series
    and tick, most of it reading the intervals' tuples); the states made keep their
    pending intervals as the group's layout and bounds, made into tuples when read."""
    checked = check_rows(states, hist, now, step, nominal)
    out: list[IntervalState | None] = [None] * len(states)
    for idx, kept, rest in checked.groups:
        blocks = as_rows(rest) if kept else [_NO_BOUNDS] * len(idx)
        for r, bounds in zip(idx, blocks, strict=True):
            level, points, misses = checked.level[r], checked.points[r], checked.misses[r]
            pending = None if kept else ()
            out[r] = interval_state(level, now, pending, points, misses, kept, bounds)
    return [s for s in out if s is not None]


Layout = tuple[tuple[float, float, int], ...]


@dataclass(frozen=True, eq=False)
class Checked:
    """Rows' adaptive states checked at `now` (`resolve_rows` before its states are made):
    each row's level, points and misses so far, and its still-pending intervals by
    groups of rows (their positions, the layout kept, the kept bounds (rows, 2, total))."""

    now: float
    level: list[float]
    points: list[int]
    misses: list[int]
    groups: list[tuple[list[int], Layout, FloatArray]]


Figures = tuple[list[float], list[int], list[int]]
"""Rows' adaptive levels, points checked and misses so far."""


@dataclass(frozen=True, eq=False)
class _Issued:
    """What `issue_checked` made its states of, when they are one group: read back by
    `check_rows` when those states come again, in order (the batch's next tick)."""

    checked_at: float
    layout: Layout
    bounds: FloatArray  # (rows, 2, total): the states' bounds are its rows
    figures: Figures


_issued: ByIdentity[IntervalState, _Issued] = ByIdentity(64)


def check_rows(
    states: Sequence[IntervalState | None],
    hist: FloatArray,
    now: float,
    step: float,
    nominal: float,
) -> Checked:
    """What `resolve_rows` finds, as lists and blocks: no state made per row (issue 20:
    `issue_checked` makes each row's one state of the tick, with the interval issued).
    The states `issue_checked` made together, come again in order (a batch's next tick),
    are one group read from what it remembered of them, not row by row: the same figures."""
    n, shift = len(states), 1.0 - nominal
    issued = _issued.get(states)
    if issued is not None:
        (level, points, misses), layout, rest = _checked(
            issued.layout, issued.checked_at, issued.bounds, hist, now, step, issued.figures, shift
        )
        return Checked(now, level, points, misses, [(list(range(n)), layout, rest)])
    level, points, misses = [nominal] * n, [0] * n, [0] * n
    empty: list[int] = []
    waiting: list[tuple[int, IntervalState]] = []
    for r, s in enumerate(states):
        if s is None:
            empty.append(r)
        elif not (s.layout if s.layout is not None else s.pending):
            level[r], points[r], misses[r] = s.level, s.points, s.misses
            empty.append(r)
        else:
            waiting.append((r, s))
    groups: list[tuple[list[int], Layout, FloatArray]] = []
    if empty:
        groups.append((empty, (), np.empty((len(empty), 2, 0))))
    every = list(range(n))
    for (checked, layout), idx in _grouped(waiting).items():
        group = [s for r in idx if (s := states[r]) is not None]
        figures = ([s.level for s in group], [s.points for s in group], [s.misses for s in group])
        bounds = stacked([_bounds(s) for s in group])  # (rows, 2, total)
        rows = hist if idx == every else hist[idx]
        after, kept, rest = _checked(layout, checked, bounds, rows, now, step, figures, shift)
        groups.append((idx, kept, rest))
        for r, at, k, m in zip(idx, *after, strict=True):
            level[r], points[r], misses[r] = at, k, m
    return Checked(now, level, points, misses, groups)


def _checked(
    layout: Layout,
    checked: float,
    bounds: FloatArray,
    hist: FloatArray,
    now: float,
    step: float,
    figures: Figures,
    shift: float,
) -> tuple[Figures, Layout, FloatArray]:
    """One group's rows (`_check`) with their `figures` so far: their figures after, the
    intervals still pending and those intervals' bounds (rows, 2, their total)."""
    seen, missed, flags = _check(layout, checked, bounds, hist, now, step)
    first = flags.index(True) if True in flags else len(flags)
    if all(flags[first:]):  # the usual case: the oldest intervals ended, a view of the rest
        start = sum(size for _, _, size in layout[:first])
        kept, rest = layout[first:], bounds[:, :, start:]
    else:
        columns = np.repeat(np.array(flags, dtype=bool), [size for _, _, size in layout])
        kept, rest = tuple(compress(layout, flags)), np.compress(columns, bounds, axis=2)
    return _moved(figures, seen, missed, shift), kept, rest


def _moved(figures: Figures, seen: IntArray, missed: IntArray, shift: float) -> Figures:
    """The adaptive figures after `seen` points (per row), `missed` of them outside their
    interval: each level moved by ACI_GAMMA x (miss rate - shift) within ACI_LEVELS where
    points were seen (every row at once, the same arithmetic as one at a time)."""
    level, points, misses = figures
    low, high = ACI_LEVELS
    at = np.array(level, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        moved = np.minimum(np.maximum(at + ACI_GAMMA * (missed / seen - shift), low), high)
    after: list[float] = np.where(seen > 0, moved, at).tolist()
    return after, (np.array(points) + seen).tolist(), (np.array(misses) + missed).tolist()


def issue_checked(
    checked: Checked, lower: FloatArray, upper: FloatArray, step: float
) -> list[IntervalState]:
    """`issue_rows` of `resolve_rows`' states, made from `check_rows`' `checked` at once:
    one state a row (`lower`, `upper` (n, steps): the rows' intervals issued now)."""
    out: list[IntervalState | None] = [None] * len(checked.level)
    now, size = checked.now, lower.shape[1]
    level, points, misses = checked.level, checked.points, checked.misses
    every = list(range(len(level)))
    if len(checked.groups) == 1 and checked.groups[0][0] == every:  # one group (the lanes)
        _, kept, rest = checked.groups[0]
        grown, block = (*kept, (now, step, size)), _grown(rest, lower, upper)
        bounds = as_rows(block)
        made = list(
            map(
                interval_state,
                level,
                repeat(now),
                repeat(None),
                points,
                misses,
                repeat(grown),
                bounds,
            )
        )
        _issued.put(made, _Issued(now, grown, block, (level, points, misses)))
        return made
    fresh = _frozen(np.stack([lower, upper], axis=1).astype(np.float64, copy=False))
    for idx, kept, rest in checked.groups:
        grown = (*kept, (now, step, size))
        rows = fresh if idx == every else fresh[idx]
        block = np.concatenate([rest, rows], axis=2) if kept else rows
        for r, b in zip(idx, as_rows(block), strict=True):
            out[r] = interval_state(level[r], now, None, points[r], misses[r], grown, b)
    return [s for s in out if s is not None]


def _grown(rest: FloatArray, lower: FloatArray, upper: FloatArray) -> FloatArray:
    """`rest` (n, 2, k) with the bounds `lower`, `upper` (n, steps) after: (n, 2, k + steps),
    made in one block (the values of `np.concatenate` of `rest` and their stack)."""
    k = rest.shape[2]
    block = np.empty((rest.shape[0], 2, k + lower.shape[1]))
    block[:, :, :k] = rest
    block[:, 0, k:], block[:, 1, k:] = lower, upper
    return block


_NO_BOUNDS: FloatArray = np.empty((2, 0))
_NO_BOUNDS.flags.writeable = False


def _grouped(states: Sequence[tuple[int, IntervalState]]) -> dict[tuple[float, Layout], list[int]]:
    """The rows of `states` by (checked_at, layout of the pending intervals). The states
    of a batch share one layout object: grouped by its identity first, so a layout's
    tuples are hashed once a group, not once a row (issue 20)."""
    same: dict[tuple[float, int], list[int]] = {}
    layouts: dict[int, Layout] = {}
    loose: list[tuple[int, IntervalState]] = []
    for r, s in states:
        layout = s.layout
        if layout is None:
            loose.append((r, s))
            continue
        key = (s.checked_at, id(layout))
        rows = same.get(key)
        if rows is None:
            same[key] = rows = []
            layouts[key[1]] = layout
        rows.append(r)
    groups: dict[tuple[float, Layout], list[int]] = {}
    for (checked, ident), rows in same.items():
        groups.setdefault((checked, layouts[ident]), []).extend(rows)
    for r, s in loose:
        groups.setdefault((s.checked_at, _layout(s)), []).append(r)
    return groups


def _layout(s: IntervalState) -> Layout:
    if s.layout is not None:
        return s.layout
    return tuple((p.origin, p.step, len(p.lower)) for p in s.pending)


def _bounds(s: IntervalState) -> FloatArray:
    if s.bounds is not None:
        return s.bounds
    lower = [v for p in s.pending for v in p.lower]
    upper = [v for p in s.pending for v in p.upper]
    return np.array((lower, upper), dtype=np.float64).reshape(2, len(lower))


def _frozen(a: FloatArray) -> FloatArray:
    a.flags.writeable = False
    return a


def _check(
    layout: Layout, checked: float, bounds: FloatArray, hist: FloatArray, now: float, step: float
) -> tuple[IntArray, IntArray, list[bool]]:
    """For rows sharing one layout of pending intervals, last checked at `checked`: the
    points observed since (per row), of which outside their interval, and which intervals
    are still pending (the same for every row)."""
    origins = np.array([o for o, _, _ in layout], dtype=np.float64)
    spacings = np.array([s for _, s, _ in layout], dtype=np.float64)
    sizes = np.array([n for _, _, n in layout], dtype=np.int64)
    taus = _bucket_ends(origins, spacings, sizes)
    new = (taus > checked + 1e-9) & (taus <= now + 1e-9)
    idx = hist.shape[1] - 1 - np.round((now - taus[new]) / step).astype(np.int64)
    inside = idx >= 0
    y = hist[:, idx[inside]]
    columns = np.flatnonzero(new)[inside]  # of the bounds: one gather each
    lo, hi = bounds[:, 0, columns], bounds[:, 1, columns]
    seen = np.isfinite(y)
    missed = ((y < lo) | (y > hi)) & seen
    # an interval's last bucket ends at origin + step * size; an empty one has none
    ends = np.where(sizes > 0, origins + spacings * sizes.astype(np.float64), -math.inf)
    flags: list[bool] = (ends > now + 1e-9).tolist()
    return seen.sum(axis=1), missed.sum(axis=1), flags


def _bucket_ends(origins: FloatArray, spacings: FloatArray, sizes: IntArray) -> FloatArray:
    """Every interval's bucket ends in order, origin + step * k for k = 1, ..., size; the
    intervals of one size (a batch's, issued at its ticks) as one outer sum."""
    size = int(sizes[0]) if sizes.size else 0
    if size and (sizes == size).all():
        ends: FloatArray = origins[:, None] + spacings[:, None] * np.arange(1.0, size + 1.0)
        return ends.ravel()
    k = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes) + 1
    out: FloatArray = np.repeat(origins, sizes) + np.repeat(spacings, sizes) * k.astype(np.float64)
    return out


def issue(state: IntervalState, lower: FloatArray, upper: FloatArray, step: float) -> IntervalState:
    """`state` with the interval issued now (at `state.checked_at`) pending."""
    return issue_rows([state], lower[None, :], upper[None, :], step)[0]


def issue_rows(
    states: Sequence[IntervalState], lower: FloatArray, upper: FloatArray, step: float
) -> list[IntervalState]:
    """`issue` for each state with its row of `lower` and `upper` (n, steps) at once; the
    states of one layout share the new one and their bounds are appended together (their
    pending intervals made from them when read)."""
    fresh = _frozen(np.stack([lower, upper], axis=1).astype(np.float64, copy=False))
    out: list[IntervalState | None] = [None] * len(states)
    for (checked, layout), idx in _grouped(list(enumerate(states))).items():
        grown = (*layout, (checked, step, lower.shape[1]))
        old = stacked([_bounds(states[r]) for r in idx])
        bounds = as_rows(np.concatenate([old, fresh[idx]], axis=2))
        for i, r in enumerate(idx):
            s = states[r]
            out[r] = interval_state(s.level, checked, None, s.points, s.misses, grown, bounds[i])
    return [s for s in out if s is not None]


def coverage_note(state: IntervalState | None, nominal: float) -> str:
    """How the adaptive level stands, for the forecast's reason."""
    if state is None:
        return f"interval level {nominal:g}"
    return coverage_text(nominal, state.level, state.points, state.misses)


def coverage_text(nominal: float, level: float, points: int, misses: int) -> str:
    """`coverage_note` of a state at `level` that checked `points` points, `misses` of
    them outside their interval."""
    if not points:
        return f"interval level {nominal:g}"
    seen = 1 - misses / points
    return (
        f"interval at conformal level {level:.2f} (nominal {nominal:g}, "
        f"{seen:.2f} covered of {points} points so far)"
        if math.isfinite(level)
        else f"interval level {nominal:g}"
    )


def reissue(state: IntervalState, lower: FloatArray, upper: FloatArray) -> IntervalState:
    """`state` with the interval issued now (the last pending one, issued at
    `state.checked_at`) replaced by the one finally used: the adaptive level tracks the
    interval that reached the decision."""
    pending = state.pending
    if not pending or abs(pending[-1].origin - state.checked_at) > 1e-9:
        return state
    last = pending[-1]
    issued = IssuedInterval(last.origin, last.step, tuple(lower.tolist()), tuple(upper.tolist()))
    return IntervalState(
        state.level, state.checked_at, (*pending[:-1], issued), state.points, state.misses
    )
