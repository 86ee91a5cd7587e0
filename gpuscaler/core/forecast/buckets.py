"""Resampling: raw samples into the forecast's buckets (`forecast.fit_step`), as rows.
Pure computation."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpuscaler.core.model import FloatArray, Series


def bucket_rows(
    series: Sequence[Series],
    width: float,
    end: float,
    stacked: FloatArray | None = None,
    aligned: bool = False,
) -> FloatArray:
    """`bucket` of every series as rows (n, buckets), right-aligned, NaN-padded on the
    left; series on one grid (same step, end and length, the usual case: one query's
    window) are bucketed together in one reshape (`stacked`: their values already
    stacked, (n, points), by the caller; `aligned`: the caller found them on one grid,
    same start, step and length, so not checked again series by series)."""
    first = series[0]
    same = aligned or all(
        s.step == first.step and s.end == first.end and len(s.values) == len(first.values)
        for s in series
    )
    if same and len(series) > 1:
        if stacked is None or stacked.shape != (len(series), len(first.values)):
            stacked = np.stack([s.values for s in series])
        return _bucket_means(stacked, first.step, first.end, width, end)
    rows = [bucket(s, width, end).values for s in series]
    hist = np.full((len(rows), max(len(r) for r in rows)), np.nan)
    for r, row in enumerate(rows):
        hist[r, hist.shape[1] - len(row) :] = row
    return hist


def bucket(series: Series, width: float, end: float) -> Series:
    """Means of `series` over buckets of `width` seconds ending at `end`; NaN where a bucket
    holds no finite sample. Gaps stay gaps."""
    means = _bucket_means(series.values, series.step, series.end, width, end)
    step = max(1, round(width / series.step)) * series.step
    return Series(start=end - step * (len(means) - 1), step=step, values=means)


def _bucket_means(
    values: FloatArray, step: float, last: float, width: float, end: float
) -> FloatArray:
    """Bucket means of one row, or of rows (n, points) on one grid whose last slot is at
    `last`, over the points' last axis."""
    per = max(1, round(width / step))
    # Align the last bucket's end with `end` so forecasts start from the same origin.
    offset = round((end - last) / step)
    lead = values.shape[:-1]
    if per == 1:
        return _point_means(values, offset)
    if offset > 0:
        values = np.concatenate([values, np.full((*lead, offset), np.nan)], axis=-1)
    elif offset < 0:
        values = values[..., : values.shape[-1] + offset]
    usable = (values.shape[-1] // per) * per
    block = values[..., values.shape[-1] - usable :].reshape(*lead, -1, per)
    finite = np.isfinite(block)
    counts = finite.sum(axis=-1)
    sums = np.where(finite, block, 0.0).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        means: FloatArray = np.where(counts > 0, sums / counts, np.nan)
    return means


def _point_means(values: FloatArray, offset: int) -> FloatArray:
    """`_bucket_means` of buckets of one point each (the simulator's slot is the fit
    step): each finite point summed from 0.0 (so -0.0 is 0.0) and divided by 1, NaN for
    the rest and the `offset` empty buckets after the last (issue 20: without the
    padded copy, the counts and the sums over one point)."""
    if offset < 0:
        values = values[..., : values.shape[-1] + offset]
    t = values.shape[-1]
    means: FloatArray = np.empty((*values.shape[:-1], t + max(offset, 0)))
    np.add(values, 0.0, out=means[..., :t])
    means[..., :t][~np.isfinite(values)] = np.nan
    means[..., t:] = np.nan
    return means
