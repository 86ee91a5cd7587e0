"""The replica floor's per-workload numbers taken over rows of all workloads at once.

A tick decides every workload's floor; each needs a few reductions of small arrays (its
forecast's finiteness, the highest upper bound and mean over the lead time, the path's
peak; the highest observed demand of its stabilization window). One numpy call per
workload and reduction is most of a floor's cost at 10,000 workloads (and scales worse
than linearly: each call's temporaries are scattered objects). Here workloads whose arrays
have the same shapes (forecasts) or the same record times (histories) are stacked as rows
and reduced once per group. The results are the same to the last bit as one workload at
a time (`replicas.floor_record`, `replicas.observed_peak`): a maximum is one of the values
whatever the order it is taken in; the one choice it leaves, the sign of a zero among
equal zeros, is taken from the one-at-a-time reduction."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gpuscaler.core.model import FloatArray, Forecast, TargetHistory
from gpuscaler.core.skill import floor_history, records

ForecastFigures = tuple[bool, float, float, float]
"""A forecast's (is_finite(), peak_upper_within(lead), mean peak over the lead, peak)."""

MIN_ROWS = 4
"""Groups with fewer rows are reduced one at a time (stacking costs more than it saves)."""

CHUNK_ROWS = 256
"""Rows stacked at once: a chunk's arrays stay in the cache, and a history kept after its
workload is gone keeps at most one chunk's records alive (`remember_many`'s views)."""


def lead_steps(forecast: Forecast, lead: float) -> int:
    """Steps of the path the floor reads for a lead time of `lead` seconds (at least one)."""
    return max(1, round(lead / forecast.step))


def forecast_figures(
    forecasts: Sequence[Forecast | None], leads: Sequence[float]
) -> list[ForecastFigures | None]:
    """`ForecastFigures` of each forecast with its lead, computed over rows of the
    forecasts whose arrays have the same lengths (and the same steps read); None where
    there is no forecast, or where the floor takes them one at a time as before (small
    groups, empty paths, a zero)."""
    out: list[ForecastFigures | None] = [None] * len(forecasts)
    groups: dict[tuple[int, int, int, float, float], list[int]] = {}
    for i, (f, lead) in enumerate(zip(forecasts, leads, strict=True)):
        if f is not None:
            key = (len(f.mean), len(f.lower), len(f.upper), f.step, lead)
            groups.setdefault(key, []).append(i)
    for (m, lo, u, step, lead), idx in groups.items():
        if len(idx) < MIN_ROWS or not (m and lo and u):
            continue
        steps = max(1, round(lead / step))  # lead_steps
        for at in range(0, len(idx), CHUNK_ROWS):
            part = idx[at : at + CHUNK_ROWS]
            group = [f for i in part if (f := forecasts[i]) is not None]
            _figures_rows(group, min(u, steps), min(m, steps), part, out)
    return out


def pool_figures(forecasts: Sequence[Forecast | None]) -> list[ForecastFigures | None]:
    """`forecast_figures` over each forecast's whole path (a node pool's fragments read
    `is_finite()`, `peak_upper` and `peak`: the second and fourth figures), over rows
    of the forecasts whose arrays have the same lengths and step; None as there."""
    leads = [0.0 if f is None else len(f.upper) * f.step for f in forecasts]
    return forecast_figures(forecasts, leads)


def _figures_rows(
    group: list[Forecast], su: int, sm: int, idx: list[int], out: list[ForecastFigures | None]
) -> None:
    """`forecast_figures` of forecasts with arrays of the same lengths, into out[idx]."""
    mean = _rows([f.mean for f in group])
    upper = _rows([f.upper for f in group])
    peaks: list[float] = _row_max(mean).tolist()
    # Over the whole path (a pool's figures): the same reduction of the same rows.
    means: list[float] = peaks if sm == mean.shape[1] else _row_max(mean[:, :sm]).tolist()
    rows = zip(
        _finite(group, mean, upper), _row_max(upper[:, :su]).tolist(), means, peaks, strict=True
    )
    for i, f, (ok, up, mp, peak) in zip(idx, group, rows, strict=True):
        if not ok:
            out[i] = (False, math.nan, math.nan, math.nan)
        elif up != 0.0 and mp != 0.0 and peak != 0.0:  # a zero's sign: one at a time
            out[i] = (True, up, mp, peak + f.peak_error)


def _finite(group: list[Forecast], mean: FloatArray, upper: FloatArray) -> list[bool]:
    """Each forecast's `is_finite()`: as its batch found it (`model.mark_finite`, kept on
    the forecast: what `is_finite` answers), else checked over the rows (`mean`, `upper`:
    the group's)."""
    lower = _rows([f.lower for f in group])
    finite = np.asarray(np.isfinite(mean).all(axis=1) & np.isfinite(upper).all(axis=1))
    finite &= np.isfinite(lower).all(axis=1)
    found: list[bool] = finite.tolist()
    return found


def _rows(arrays: list[FloatArray]) -> FloatArray:
    """`np.stack` of arrays of one shape (their values as they are), without the view
    `np.stack` makes of each."""
    found: FloatArray = np.concatenate(arrays).reshape(len(arrays), *np.shape(arrays[0]))
    return found


def _row_max(a: FloatArray) -> FloatArray:
    found: FloatArray = np.max(a, axis=1)
    return found


Record = tuple[float, float, float, float]

_NO_RECORDS: FloatArray = np.zeros((0, 4))


RowChunk = tuple[list[int], FloatArray]
"""Histories of `remember_rows` whose records have the same times: their places in its
list and their records' array (rows, records, 4), whose rows they keep as `seen_rows`."""


def remember_many(
    hs: Sequence[TargetHistory], now: float, recs: Sequence[Record], keeps: Sequence[float]
) -> list[TargetHistory]:
    """`skill.remember(h, now, *rec[1:], keep)` of each history: the same records (tuple
    and array). Histories whose records have the same times keep the same ones, so they
    are dropped and the new record added over rows, a chunk of rows in one array whose
    read-only rows the histories keep (one buffer a chunk instead of one a workload)."""
    return remember_rows(hs, now, recs, keeps)[0]


def remember_rows(
    hs: Sequence[TargetHistory], now: float, recs: Sequence[Record], keeps: Sequence[float]
) -> tuple[list[TargetHistory], list[RowChunk]]:
    """`remember_many`, and its chunks: every history is in one, so the records the
    tick reads next (observed peaks, reserves) are read as rows of them, not grouped
    and stacked again."""
    out: list[TargetHistory | None] = [None] * len(hs)
    chunks: list[RowChunk] = []
    arrays = [records(h) if h.seen else _NO_RECORDS for h in hs]
    sizes: dict[tuple[float, int], list[int]] = {}
    for i, (rows, keep) in enumerate(zip(arrays, keeps, strict=True)):
        sizes.setdefault((keep, len(rows)), []).append(i)
    for (keep, n), same_size in sizes.items():
        for idx, first, old in _same_times(same_size, arrays, n):
            kept = np.flatnonzero(first[:, 0] > now - keep)
            k = kept.size
            newest = k == 0 or kept[0] == n - k  # records in time order: the newest kept
            for at in range(0, len(idx), CHUNK_ROWS):
                part = idx[at : at + CHUNK_ROWS]
                new = np.empty((len(part), k + 1, 4))
                if k:
                    rows = old[at : at + CHUNK_ROWS]
                    new[:, :k] = rows[:, n - k :] if newest else rows[:, kept]
                new[:, k] = [recs[i] for i in part]
                new.setflags(write=False)
                chunks.append((part, new))
                for i, view in zip(part, new, strict=True):  # its rows: views, read-only
                    h = hs[i]
                    seen = h.seen[n - k :] if newest else tuple(h.seen[c] for c in kept.tolist())
                    seen += (recs[i],)  # a third faster than (*seen, recs[i])
                    out[i] = floor_history(h, seen=seen, seen_rows=view)
    return [h for h in out if h is not None], chunks


def _same_times(
    idx: list[int], arrays: list[FloatArray], n: int
) -> list[tuple[list[int], FloatArray, FloatArray]]:
    """The histories `idx` (n records each) grouped by their records' times (the same
    bits), each group with its first history's records and all its records stacked
    (rows, n, 4): one comparison over rows, most often one group."""
    stacked = _rows([arrays[i] for i in idx]) if n else np.zeros((len(idx), 0, 4))
    if len(idx) == 1 or not n:
        return [(idx, stacked[0], stacked)]
    times = stacked[:, :, 0].view(np.int64)  # bits: as `tobytes` compares them
    if (times == times[0]).all():
        return [(idx, stacked[0], stacked)]
    groups: dict[bytes, list[int]] = {}
    for j, row in enumerate(times):
        groups.setdefault(row.tobytes(), []).append(j)
    found = []
    for js in groups.values():
        part = stacked[js]
        found.append(([idx[j] for j in js], part[0], part))
    return found


def chunk_peaks(chunks: Sequence[RowChunk], now: float, windows: Sequence[float]) -> list[float]:
    """`replicas.observed_peak` of each of `remember_rows`' histories (`windows`: theirs,
    in its order), read from its chunks: the same values, in the same order, Python's
    max (the histories whose records have the same times share the window's places)."""
    out = [0.0] * len(windows)
    for idx, recs in chunks:
        t = recs[0, :, 0]
        by_window: dict[float, list[int]] = {}
        for j, i in enumerate(idx):
            by_window.setdefault(windows[i], []).append(j)
        for window, js in by_window.items():
            cols = np.flatnonzero((t > now - window) | (t == now))
            part = recs if len(js) == len(idx) else recs[js]
            for j, peak in zip(js, _row_peaks(part[:, cols, 1]), strict=True):
                out[idx[j]] = peak
    return out


def _row_peaks(values: FloatArray) -> list[float]:
    """Python's `max` of each row of `values`, taken over the rows where it is numpy's:
    every value finite and the maximum not zero (Python's keeps the first of equal
    zeros, whose sign numpy's may not; of equal values not zero all have the same
    bits); one row at a time elsewhere, as Python's (an empty row: its ValueError)."""
    if not values.shape[1]:
        return [max(row) for row in values.tolist()]
    top: list[float] = _row_max(values).tolist()
    sure: list[bool] = np.asarray(np.isfinite(values).all(axis=1)).tolist()
    for r, (peak, ok) in enumerate(zip(top, sure, strict=True)):
        if not ok or peak == 0.0:
            top[r] = max(values[r].tolist())
    return top
