"""Steady reads of many windows at once (issue 18): what `PrometheusMetrics._fetch_once`
does per target for a steady read (advance the window to the tick's end, decode the new
points, drop values out of range, write them, note NaN/Inf and whether any sample came),
done for every target of the grouped answers in a few numpy steps over one targets x
time array instead of about 15 numpy calls per target.

Only the plain case is taken: a window read before (`fetched_until` set), its new points
one chunk already fetched by a grouped query and decoded by `fast.decode_fast`, targets
that share the window's previous end and `fetched_until`. Anything else is read one by
one as before. Nothing is written into a window here: `_fetch_once` takes a `Steady`
(the window's new values and what the read found) in place of its advance and read, and
does the rest (the empty-window check, `fetched_until`, the problem) as for any target.
Each window gets its own row of a new array each tick, so a Series handed out earlier
keeps its values.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpuscaler.adapters.prometheus.source import MAX_POINTS, Steady
from gpuscaler.adapters.prometheus.window import LOAD, PERCENT, Window, outside_problem
from gpuscaler.config import Config
from gpuscaler.core.model import FloatArray


@dataclass(frozen=True)
class Target:
    key: str
    query: str
    bounds: tuple[float, float]


def grouped_targets(pairs: Iterable[tuple[str, str]]) -> list[Target]:
    """The (key, query) of a grouped range query's targets with the bounds
    `PrometheusMetrics.read` checks them against: a pool's signal is a percentage, a
    workload's load (a serving stack's demand is never grouped) at most `LOAD`; a
    target read with other bounds is read one by one (`_fetch_once` checks)."""
    return [Target(k, q, PERCENT if k.startswith("pool:") else LOAD) for k, q in pairs]


def steady_reads(
    windows: Mapping[str, Window],
    pairs: Iterable[tuple[str, str]],
    answers: Mapping[tuple[str, float, float], object],
    now: float,
    config: Config,
) -> dict[str, Steady]:
    """The steady reads of the grouped range queries' targets, (key, query), that can be
    done at once, by key."""
    step, overlap = config.metrics.step, config.prometheus.overlap
    size = round(config.metrics.window / step)
    return _steady(windows, grouped_targets(pairs), answers, now, step, size, overlap)


def _steady(
    windows: Mapping[str, Window],
    targets: Sequence[Target],
    answers: Mapping[tuple[str, float, float], object],
    now: float,
    step: float,
    size: int,
    overlap: float,
) -> dict[str, Steady]:
    end = math.floor(now / step) * step
    first = end - step * (size - 1)
    batches: dict[tuple[float, float], list[tuple[Target, Window, FloatArray, FloatArray]]] = {}
    for t in targets:
        w = windows.get(t.key)
        if w is None or w.fetched_until is None or w.end is None or w.values.size != size:
            continue
        start = max(first, w.fetched_until - overlap)
        lo, last = math.floor(start), math.floor(end)
        if last > lo + math.floor(MAX_POINTS * step):
            continue  # more than one chunk
        answer = answers.get((t.query, lo, last))
        if not (isinstance(answer, list) and len(answer) == 1 and isinstance(answer[0], dict)):
            continue
        arrays = answer[0].get("arrays")
        if arrays is None or not isinstance(answer[0].get("values"), list):
            continue
        batches.setdefault((w.end, w.fetched_until), []).append((t, w, *arrays))
    out: dict[str, Steady] = {}
    for (before, _), rows in batches.items():
        out.update(_batch(rows, before, end, step, size))
    return out


def _advanced(rows: list[FloatArray], before: float, end: float, step: float) -> FloatArray:
    """`Window.advance` of windows that all end at `before`, as one array."""
    size = rows[0].size
    old = np.stack(rows)
    new = np.empty_like(old)
    shift = round((end - before) / step)
    keep = size - shift
    if 0 < keep <= size:
        new[:, :keep] = old[:, shift:]
    elif shift <= 0:
        new, keep = old, size
    else:
        keep = 0
    new[:, keep:] = np.nan
    return new


def _batch(
    rows: list[tuple[Target, Window, FloatArray, FloatArray]],
    before: float,
    end: float,
    step: float,
    size: int,
) -> dict[str, Steady]:
    matrix = _advanced([w.values for _, w, _, _ in rows], before, end, step)
    lengths = np.array([t.size for _, _, t, _ in rows])
    row = np.repeat(np.arange(len(rows)), lengths)
    times = np.concatenate([t for _, _, t, _ in rows])
    values = np.concatenate([v for _, _, _, v in rows])  # a copy: answers stay as they were
    bad = ~np.isfinite(values)
    values[bad] = np.nan
    had_bad = np.bincount(row[bad], minlength=len(rows)) > 0
    lo = np.array([t.bounds[0] for t, _, _, _ in rows])[row]
    hi = np.array([t.bounds[1] for t, _, _, _ in rows])[row]
    outside = (values < lo) | (values > hi)  # NaN compares False
    absurd: dict[int, str | None] = {}
    for r in np.unique(row[outside]).tolist():
        mine = row == r
        absurd[r] = outside_problem(values[mine & outside], rows[r][0].bounds)
    values[outside] = np.nan
    idx = np.rint((times - end) / step).astype(np.int64) + (size - 1)
    ok = (idx >= 0) & (idx < size)
    matrix.reshape(-1)[(row * size + idx)[ok]] = values[ok]
    return {
        t.key: Steady(
            t.query,
            t.bounds,
            end,
            matrix[i],
            bool(had_bad[i]),
            absurd.get(i),
            bool(lengths[i] > 0),
        )
        for i, (t, _, _, _) in enumerate(rows)
    }
