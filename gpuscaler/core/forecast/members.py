"""The windows the forecaster reads (`fit_step` bucket means) and its flat members'
levels (exponential smoothing, window means), for many series at once."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from gpuscaler.core.model import FloatArray, IntArray, Series

SES_ALPHAS = np.array([0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0])
"""Smoothing constants of simple exponential smoothing, searched per series."""
SES_ALPHAS.flags.writeable = False


def bucket_means(
    values: FloatArray, spacing: float, last: float, width: float, end: float
) -> FloatArray:
    """Means (..., buckets) of samples (..., points) `spacing` apart whose last one is at
    `last`, over buckets of `width` seconds, the last one ending at `end`."""
    per = max(1, round(width / spacing))
    offset = round((end - last) / spacing)  # empty slots after the last sample
    lead = values.shape[:-1]
    if offset > 0:
        values = np.concatenate([values, np.full((*lead, offset), np.nan)], axis=-1)
    elif offset < 0:
        values = values[..., : values.shape[-1] + offset]
    usable = values.shape[-1] // per * per
    block = values[..., values.shape[-1] - usable :].reshape(*lead, -1, per)
    finite = np.isfinite(block)
    counts = finite.sum(axis=-1)
    sums = np.where(finite, block, 0.0).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        means: FloatArray = np.where(counts > 0, sums / counts, np.nan)
    return means


def bucket(series: Series, width: float, end: float) -> FloatArray:
    """`series`' bucket means (buckets,) of `width` seconds, the last ending at `end`."""
    return bucket_means(series.values, series.step, series.end, width, end)


def bucket_rows(series: Sequence[Series], width: float, end: float) -> FloatArray:
    """`bucket` of every series as rows (n, buckets), right-aligned, NaN-padded on the
    left; series on one grid (one query's window, the usual case) in one reshape."""
    first = series[0]
    if all(
        s.step == first.step and s.end == first.end and s.values.size == first.values.size
        for s in series
    ):
        return bucket_means(np.stack([s.values for s in series]), first.step, first.end, width, end)
    rows = [bucket(s, width, end) for s in series]
    hist = np.full((len(rows), max(r.size for r in rows)), np.nan)
    for r, row in enumerate(rows):
        hist[r, hist.shape[1] - row.size :] = row
    return hist


def sampled(series: Sequence[Series | None]) -> tuple[list[float | None], list[float]]:
    """Each series' last sample time (None: no sample) and seconds observed (finite
    samples x step), read from all their values at once, right-aligned in one array."""
    sizes = np.array([s.values.size if s is not None else 0 for s in series])
    values = np.full((sizes.size, max(1, int(sizes.max(initial=0)))), np.nan)
    for r, s in enumerate(series):
        if s is not None and s.values.size:
            values[r, values.shape[1] - s.values.size :] = s.values
    finite = np.isfinite(values)
    count = finite.sum(axis=1)
    newest = sizes - 1 - np.argmax(finite[:, ::-1], axis=1)  # index of the last sample
    start = np.array([s.start if s is not None else np.nan for s in series])
    step = np.array([s.step if s is not None else np.nan for s in series])
    last = np.where(count > 0, start + step * newest, np.nan).tolist()
    observed: list[float] = (count * step).tolist()
    return [t if c else None for t, c in zip(last, count.tolist(), strict=True)], observed


def forward_fill(a: FloatArray) -> FloatArray:
    """Each gap of each row takes the last finite value before it; leading gaps take the
    row's first finite value (NaN for a row with none). A new array."""
    out = a.copy()
    finite = np.isfinite(a)
    gappy = np.flatnonzero(~finite.all(axis=1))  # most windows have no gap: left as they are
    if gappy.size and a.shape[1]:
        ok = finite[gappy]
        idx = np.where(ok, np.arange(a.shape[1])[None, :], 0)
        np.maximum.accumulate(idx, axis=1, out=idx)
        filled = a[gappy[:, None], idx]
        first = a[gappy, np.argmax(ok, axis=1)]
        out[gappy] = np.where(np.isfinite(filled), filled, first[:, None])
    return out


def ses_at(hist: FloatArray, filled: FloatArray, ends: IntArray) -> FloatArray:
    """Smoothed levels (alphas, n, len(ends)) after the point at each index of `ends`:
    level[j] = alpha * y[j] + (1 - alpha) * level[j - 1] from level[0] = y[0] over the
    forward-filled window `filled` (`forward_fill(hist)`, made once for every reader),
    written out as the weighted sum it is (one matrix product)."""
    t = hist.shape[1]
    age = ends[:, None] - np.arange(t)[None, :]  # (ends, t): how far each point lies back
    keep = 1.0 - SES_ALPHAS[:, None, None]
    with np.errstate(under="ignore"):
        weights = np.where(age >= 0, SES_ALPHAS[:, None, None] * keep ** np.maximum(age, 0), 0.0)
        weights[:, :, 0] = np.where(age[:, 0] >= 0, keep[:, :, 0] ** ends[None, :], 0.0)
    a, e = weights.shape[:2]
    products = weights.reshape(a * e, t) @ np.nan_to_num(filled).T  # (alphas * ends, n)
    levels: FloatArray = products.reshape(a, e, -1).transpose(0, 2, 1)
    finite = np.isfinite(hist)
    first = np.where(finite.any(axis=1), np.argmax(finite, axis=1), t)
    levels[:, first[:, None] > ends[None, :]] = np.nan  # no sample up to that end yet
    return levels


def window_means_at(hist: FloatArray, ends: IntArray, points: int) -> FloatArray:
    """Mean of the finite values among the `points` up to each end (n, len(ends)); NaN
    where there is none (a window reaching before the first point holds fewer)."""
    padded = np.concatenate([np.full((hist.shape[0], points - 1), np.nan), hist], axis=1)
    windows = sliding_window_view(padded, points, axis=1)[:, ends]  # (n, ends, points)
    finite = np.isfinite(windows)
    count = finite.sum(axis=2)
    total = np.where(finite, windows, 0.0).sum(axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        out: FloatArray = np.where(count > 0, total / count, np.nan)
    return out
