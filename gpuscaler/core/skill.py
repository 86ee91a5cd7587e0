"""Has a workload's forecast earned its floor? A counterfactual on the observed series.

At each past tick (an origin o) capacities are compared against what came:
- reactive R_o: what a reactive scaler on the same signal sizes for, the highest value
  seen in the stabilization window before o (the HPA holds its highest recommendation
  of that window while scaling down);
- predictive P_o = max(R_o, forecast upper bound over the lead time at o): the floor;
- need Y_o: the highest value observed in (o, o + lead].
Shortfalls are max(0, Y - capacity). The floor's extra capacity, sum(P - R), is then
placed two cheaper ways at the same total: spread evenly (flat headroom, what a lower
target buys), and as a level floor (the recent mean plus the forecast's own band, shifted
to the same cost: what knowing the level without foresight buys). Skill is the shortfall
the forecast avoided beyond the better of the two, as a share of the reactive shortfall.
Zero: the forecast's extra capacity did no better than a lower target or a level would
have; no reactive shortfall at all means nothing to gain (skill 0).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpuscaler.core.at_cost import bisect_rows
from gpuscaler.core.model import FloatArray, IntArray, TargetHistory
from gpuscaler.core.pairwise import window_means_rows


@dataclass(frozen=True, slots=True)
class Skill:
    score: float | None
    """None until enough origins are scored."""
    origins: int


def records(h: TargetHistory) -> FloatArray:
    """`h.seen` as a (records, 4) array: the one `remember` kept, else converted."""
    rows = h.seen_rows
    if rows is None or len(rows) != len(h.seen) or (h.seen and rows[-1, 0] != h.seen[-1][0]):
        rows = np.asarray(h.seen, dtype=np.float64).reshape(-1, 4)
    return rows


def floor_history(
    h: TargetHistory,
    *,
    seen: tuple[tuple[float, float, float, float], ...] | None = None,
    seen_rows: FloatArray | None = None,
    recommendations: tuple[tuple[float, int], ...] | None = None,
    fallback: bool | None = None,
) -> TargetHistory:
    """`h` with the replica floor's parts given replaced (`seen` with its `seen_rows`),
    the rest kept: what `dataclasses.replace` gives, built directly (twice as fast; the
    floor replaces a history up to three times a workload a tick), its fields given by
    position (a third cheaper than by name; tests/test_floor_batch.py checks each field)."""
    if seen is None:
        seen, seen_rows = h.seen, h.seen_rows
    return TargetHistory(
        h.last_change_at,
        h.last_direction,
        h.pending_since,
        h.pending_direction,
        h.recommendations if recommendations is None else recommendations,
        h.calm_since,
        seen,
        h.fallback if fallback is None else fallback,
        seen_rows,
    )


def remember(
    h: TargetHistory, now: float, value: float, upper: float, mean: float, keep: float
) -> TargetHistory:
    """History with this tick's observation and forecast (upper bound and mean peak over
    the lead time) added, records older than `keep` gone (their array kept beside them,
    updated rather than rebuilt)."""
    record = (now, value, upper, mean)
    if not h.seen:  # the first record: nothing to drop
        new_rows = np.asarray([record], dtype=np.float64)
        new_rows.setflags(write=False)
        return floor_history(h, seen=(record,), seen_rows=new_rows)
    rows = records(h)
    kept = np.flatnonzero(rows[:, 0] > now - keep)
    n, k = len(h.seen), kept.size
    # Records come in time order, so those kept are the newest: a slice of the tuple
    # and of the array.
    newest = k == 0 or kept[0] == n - k
    old = h.seen[n - k :] if newest else tuple(h.seen[i] for i in kept)
    new_rows = np.empty((k + 1, 4))
    new_rows[:k] = rows[n - k :] if newest else rows[kept]
    new_rows[k] = record
    new_rows.setflags(write=False)
    return floor_history(h, seen=(*old, record), seen_rows=new_rows)


def _shortfall(need: FloatArray, capacity: FloatArray) -> float:
    return float(np.maximum(0.0, need - capacity).sum())


def window_max(values: FloatArray, start: IntArray, stop: IntArray) -> FloatArray:
    """max(values[start[i]:stop[i]]) for each i, NaN kept (as `np.max` does); -inf where
    the window is empty (`window_max_rows` of the one row)."""
    found: FloatArray = window_max_rows(values[None], start, stop)[0]
    return found


def window_max_rows(values: FloatArray, start: IntArray, stop: IntArray) -> FloatArray:
    """The maximum of each row of `values` over each window [start, stop) (the same
    windows for every row; -inf for an empty one, NaN kept), from a sparse table: level
    k holds the maxima of the runs of 2**k values, and a window of width w is the
    maximum of its first and its last run of 2**floor(log2 w), which overlap (a value
    taken twice is the same maximum). One level a width class, not one reduction a row
    and window (`np.maximum.reduceat`'s small segments cost ~1 us each). The value is
    the window's maximum however taken; of a window's equal zeros or NaNs the one kept
    may differ from another order's (its sign or payload), which no sum, comparison or
    text the floor makes of it can tell (tests/test_window_max.py)."""
    rows, count = len(values), start.size
    if not count:
        return np.full((rows, 0), -np.inf)
    width = stop - start
    w = int(width[0])
    if w > 0 and int(width.min()) == int(width.max()) == w and _one_after_another(start):
        # One width, an origin a record: each window's two runs are two slices.
        top = w.bit_length() - 1
        table = _level(values, top)
        first, last = int(start[0]), int(stop[0]) - (1 << top)
        # In C order, as the rows' sums read them (numpy picks the layout its inputs'
        # strides suggest, and sums other layouts in another order).
        found: FloatArray = np.maximum(
            table[:, first : first + count], table[:, last : last + count], order="C"
        )
        return found
    # The exponent of w in [0.5, 1) x 2**e, less one: floor(log2 w), exact for integers
    # (-1 for an empty window).
    level = np.frexp(width)[1] - 1
    out: FloatArray = np.full((rows, count), -np.inf)
    table = values
    for k in range(int(level.max()) + 1):
        if k:
            table = _level(table, 1, k - 1)
        at = np.flatnonzero(level == k)
        if at.size:
            first_at, last_at = start[at], stop[at] - (1 << k)
            out[:, at] = np.maximum(table[:, first_at], table[:, last_at])
    return out


def _level(values: FloatArray, top: int, done: int = 0) -> FloatArray:
    """Level `done + top` of the sparse table from its level `done` (`values`): the
    maxima of the runs of 2**(done + top) values."""
    table = values
    for k in range(done, done + top):
        half = 1 << k
        table = np.maximum(table[:, :-half], table[:, half:])
    return table


def _one_after_another(first: IntArray) -> bool:
    """Whether the indices count up by one."""
    return bool((first[1:] - first[:-1] == 1).all())


def _window_means(v: FloatArray, order: IntArray, start: IntArray, stop: IntArray) -> FloatArray:
    """Mean of v[order[start[i]:stop[i]]] for each i (windows not empty), summed as a
    row of len(v) holding the window's values in their own places and zeros elsewhere
    (what `np.where(in_window, v, 0.0).sum(axis=1)` sums, so it rounds the same), the
    rows filled by index rather than by comparing every record with every window."""
    lengths = stop - start
    rows = np.repeat(np.arange(start.size), lengths)
    firsts = np.repeat(start - (np.cumsum(lengths) - lengths), lengths)
    cols = order[np.arange(rows.size) + firsts]
    filled = np.zeros((start.size, v.size))
    filled[rows, cols] = v[cols]
    means: FloatArray = filled.sum(axis=1) / lengths
    return means


def _bisect_excess(reactive: FloatArray, base: FloatArray, extra: float) -> float:
    """`_at_cost`'s c: the bisection whose every step asks whether
    sum(max(reactive, base + c)) - sum(reactive) > extra. Each step is first answered from
    sorted breakpoints and prefix sums (a few float operations); the arrays are summed, as
    the bisection always did, only for a c so close to the answer that the two sums'
    rounding could disagree, so every step, and c, is what the array sums give."""
    total = reactive.sum()
    lo, hi = -float(np.max(base - reactive)) - 1.0, float(extra) + 1.0
    exact = _exact_excess(reactive, base, total)
    cheap = _cheap_excess(reactive, base, float(total), extra)
    for _ in range(40):
        c = (lo + hi) / 2
        answer = cheap(c) if cheap is not None else None
        if answer is None:
            answer = exact(c) > extra
        if answer:
            hi = c
        else:
            lo = c
    return lo


def _exact_excess(reactive: FloatArray, base: FloatArray, total: float) -> Callable[[float], float]:
    def excess(c: float) -> float:
        return float(np.maximum(reactive, base + c).sum() - total)

    return excess


def _cheap_excess(
    reactive: FloatArray, base: FloatArray, total: float, extra: float
) -> Callable[[float], bool | None] | None:
    """Whether the excess at c is over `extra`, from breakpoints d = reactive - base
    (max(reactive, base + c) is base + c where d < c); None where the float sums could
    round either way (within a bound 4x the summation error's) or inputs are not finite."""
    if not (np.isfinite(reactive).all() and np.isfinite(base).all() and math.isfinite(extra)):
        return None
    d = reactive - base
    order = np.argsort(d, kind="stable")
    ds: list[float] = d[order].tolist()
    base_below: list[float] = [0.0, *np.cumsum(base[order]).tolist()]
    reactive_above: list[float] = [*np.cumsum(reactive[order][::-1])[::-1].tolist(), 0.0]
    n = len(ds)
    scale = float(np.abs(reactive).sum() + np.abs(base).sum()) + abs(total) + abs(extra) + 1.0
    tol = 16 * (n + 4) * np.finfo(np.float64).eps
    below_all = ds[0] - tol * (max(abs(ds[0]), abs(ds[-1])) + 1.0)

    def over(c: float) -> bool | None:
        k = bisect_left(ds, c)
        if c < below_all:
            # base + c rounds to at most reactive everywhere: the sum is exactly `total`.
            return extra < 0.0
        excess = base_below[k] + k * c + reactive_above[k] - total
        if abs(excess - extra) > tol * (scale + n * abs(c)):
            return excess > extra
        return None

    return over


def _at_cost(reactive: FloatArray, base: FloatArray, extra: float) -> FloatArray:
    """max(reactive, base + c) with c chosen (bisection) so its extra over `reactive`
    sums to `extra`."""
    return np.maximum(reactive, base + _bisect_excess(reactive, base, extra))


def assess(
    h: TargetHistory,
    now: float,
    lead: float,
    stabilization: float,
    min_origins: int,
    span: float = math.inf,
) -> Skill:
    """The forecast's skill over the origins of the last `span` seconds of `h.seen`."""
    if len(h.seen) < 2:
        return Skill(None, 0)
    return _assess_records(records(h), now, lead, stabilization, min_origins, span)


def _assess_records(
    rec: FloatArray, now: float, lead: float, stabilization: float, min_origins: int, span: float
) -> Skill:
    """`assess` of the (records, 4) array `rec` (at least two records)."""
    t, v = rec[:, 0], rec[:, 1]
    # Ticks without a forecast (NaN bound: too little history) are observed, not scored.
    scored = np.flatnonzero((t + lead <= now) & (t > now - span) & np.isfinite(rec[:, 2]))
    order = np.argsort(t, kind="stable")
    ts, vs = t[order], v[order]
    o = t[scored]
    after = (np.searchsorted(ts, o, "right"), np.searchsorted(ts, o + lead, "right"))
    ok = after[1] > after[0]
    n = int(ok.sum())
    if n < min_origins:
        return Skill(None, n)
    scored, o = scored[ok], o[ok]
    # Each origin's windows are runs of the records in time order: their maxima are
    # exact however taken. The level's sum is taken as it always was (zeros outside the
    # window, in the records' order), so that it rounds the same.
    start = np.searchsorted(ts, o - stabilization, "left")
    reactive = window_max(vs, start, after[0][ok])
    need = window_max(vs, after[0][ok], after[1][ok])
    level = _window_means(v, order, start, after[0][ok])
    upper, mean = rec[scored, 2], rec[scored, 3]
    predictive = np.maximum(reactive, upper)
    short_r = _shortfall(need, reactive)
    if short_r <= 1e-9:
        return Skill(0.0, n)
    extra = float((predictive - reactive).sum())
    flat = reactive + extra / n
    levelled = _at_cost(reactive, level + (upper - mean), extra)
    best_other = min(_shortfall(need, flat), _shortfall(need, levelled))
    return Skill((best_other - _shortfall(need, predictive)) / short_r, n)


def in_fallback(h: TargetHistory, skill: Skill, below: float, above: float) -> bool:
    """Whether the floor steps back to reactive: skill under `below` engages, over
    `above` returns (hysteresis). Until enough origins are scored the forecast has
    proven nothing: reactive."""
    if skill.score is None:
        return True
    if h.fallback:
        return skill.score < above
    return skill.score < below


def assess_chunk(
    recs: FloatArray,
    now: float,
    lead: float,
    stabilization: float,
    min_origins: int,
    span: float = math.inf,
) -> list[Skill]:
    """`assess` of each history whose records are a row of `recs` (rows, records, 4), all
    with the same times (`floor_rows.remember_rows`' chunks): the same Skill each (bit
    for bit), computed together: rows with the same ticks without a forecast share their
    windows, so each step is one numpy operation over all of them (a workload-tick's
    ~100 calls on small arrays become one call per tick and group)."""
    if recs.shape[1] < 2:
        return [Skill(None, 0)] * len(recs)
    out: list[Skill] = [Skill(None, 0)] * len(recs)
    for rows in _forecast_groups(recs):
        if len(rows) < _MIN_ROWS:  # a few rows cost less one by one
            for i in rows:
                out[i] = _assess_records(recs[i], now, lead, stabilization, min_origins, span)
            continue
        part = recs if len(rows) == len(recs) else recs[rows]
        skills = _assess_rows(part, now, lead, stabilization, min_origins, span)
        for i, found in zip(rows, skills, strict=True):
            out[i] = found
    return out


def _forecast_groups(recs: FloatArray) -> list[list[int]]:
    """The rows of `recs` grouped by their records without a forecast (NaN bound): most
    often all rows in one group."""
    finite = np.isfinite(recs[:, :, 2])
    if (finite == finite[0]).all():
        return [list(range(len(recs)))]
    groups: dict[bytes, list[int]] = {}
    for i, row in enumerate(finite):
        groups.setdefault(row.tobytes(), []).append(i)
    return list(groups.values())


_MIN_ROWS = 4
"""Fewer histories than this in a group are assessed one by one: a numpy step over rows
costs more than a step of one row (measured on a steady 19-lane tick's records, 250 a
history, load 7: one by one against rows, 2 histories 0.70 / 0.80 ms, 4: 1.25 / 1.11,
6: 2.60 / 0.99, 12: 4.37 / 1.24; it was 12 while the bisection took ~25 calls a step)."""


def _assess_rows(
    recs: FloatArray, now: float, lead: float, stab: float, min_origins: int, span: float
) -> list[Skill]:
    """`assess` of each (records, 4) row of `recs`, all with the same times and the same
    ticks without a forecast: `assess`'s steps, over rows (records in time order, as
    remembered, are read in place: their stable order is their own)."""
    rec0 = recs[0]
    t = rec0[:, 0]
    scored = np.flatnonzero((t + lead <= now) & (t > now - span) & np.isfinite(rec0[:, 2]))
    order = None if _one_by_one(t) else np.argsort(t, kind="stable")
    ts = t if order is None else t[order]
    o = t[scored]
    after = (np.searchsorted(ts, o, "right"), np.searchsorted(ts, o + lead, "right"))
    ok = after[1] > after[0]
    n = int(ok.sum())
    if n < min_origins:
        return [Skill(None, n)] * len(recs)
    scored, o = scored[ok], o[ok]
    start = np.searchsorted(ts, o - stab, "left")
    v = np.ascontiguousarray(recs[:, :, 1])
    vs = v if order is None else v[:, order]
    reactive = window_max_rows(vs, start, after[0][ok])
    need = window_max_rows(vs, after[0][ok], after[1][ok])
    level = window_means_rows(v, order, start, after[0][ok])
    at = _run(scored)
    upper = np.ascontiguousarray(recs[:, at, 2])
    mean = np.ascontiguousarray(recs[:, at, 3])
    predictive = np.maximum(reactive, upper)
    short_r = _shortfalls(need, reactive)
    extra = (predictive - reactive).sum(axis=1)
    flat = reactive + (extra / n)[:, None]
    base = level + (upper - mean)
    levelled = np.maximum(reactive, base + bisect_rows(reactive, base, extra)[:, None])
    short_f, short_l = _shortfalls(need, flat), _shortfalls(need, levelled)
    short_p = _shortfalls(need, predictive)
    out = []
    for r, f, lv, p in zip(
        short_r.tolist(), short_f.tolist(), short_l.tolist(), short_p.tolist(), strict=True
    ):
        out.append(Skill(0.0, n) if r <= 1e-9 else Skill((min(f, lv) - p) / r, n))
    return out


def _run(at: IntArray) -> slice | IntArray:
    """Increasing indices `at` as a slice when they are one run (most often: the
    records old enough to be scored), which reads the same values without a gather."""
    if at.size and int(at[-1]) - int(at[0]) + 1 == at.size:
        return slice(int(at[0]), int(at[-1]) + 1)
    return at


def _one_by_one(t: FloatArray) -> bool:
    """Whether the times never go down (a stable sort leaves them where they are)."""
    return bool((t[1:] >= t[:-1]).all())


def _shortfalls(need: FloatArray, capacity: FloatArray) -> FloatArray:
    """`_shortfall` of each row."""
    found: FloatArray = np.maximum(0.0, need - capacity).sum(axis=1)
    return found
