"""A reserve for demand that reactive capacity cannot meet in time: short overflows.

Reactive sizing (the HPA formula on the highest demand of the stabilization window, the
floor's own reactive part) leaves headroom up to full use of the replicas it sizes. A
burst that goes past that full use is served late: by the time new replicas are ready
(the sync delay, then a cold start) a burst shorter than that is gone, and its requests
waited. Only capacity already in place serves such bursts.

So each tick of the remembered span (the workload's tick records, one per tick: the
peak since the previous one) is checked against what that reactive sizing would have had
at full use when it came, from the window before it alone (the counterfactual, not the
replicas that ran: a reserve that served the next burst must not erase the evidence for
itself). The highest demand that overflowed it is the reserve: the floor keeps enough
replicas to serve it at full use for the rest of the span. A ramp or a diurnal rise never
overflows (the target's headroom covers a tick's rise); bursts do; none in the span, no
reserve.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuscaler.core.model import FloatArray, IntArray
from gpuscaler.core.skill import window_max_rows


@dataclass(frozen=True)
class Reserve:
    peak: float
    """The highest demand of the span that overflowed the reactive sizing's full use."""
    age: float
    """Seconds since that tick."""
    overflows: int
    """Ticks of the span that overflowed."""


def overflow_reserve(
    seen: tuple[tuple[float, float, float, float], ...] | FloatArray,
    now: float,
    window: float,
    span: float,
    at_target: float,
    full: float,
) -> Reserve | None:
    """The reserve the tick records of the last `span` seconds call for (None when no
    tick overflowed). `at_target`: what one replica serves at the target; `full`: at
    full use, both in the records' unit. `seen`: the records, or their array."""
    if len(seen) < 2:
        return None  # a record needs one before it to size from
    rec = np.asarray(seen, dtype=np.float64).reshape(-1, 4)
    sizes = np.asarray([[at_target], [full]], dtype=np.float64)
    return _reserve_rows(rec[:, 0], rec[None, :, 1], now, window, span, sizes[0], sizes[1])[0]


def overflow_reserve_chunk(
    recs: FloatArray,
    now: float,
    window: float,
    span: float,
    at_target: Sequence[float],
    full: Sequence[float],
) -> list[Reserve | None]:
    """`overflow_reserve` of each record array of `recs` (rows, records, 4), whose
    records all have the same times (floor_rows.remember_rows' chunks), with its own
    `at_target` and `full`: the same Reserve each, its rows read in place."""
    if recs.shape[1] < 2:
        return [None] * len(recs)
    t = recs[0, :, 0]
    sizes = np.asarray([at_target, full], dtype=np.float64)
    out: list[Reserve | None] = []
    for first in range(0, len(recs), CHUNK_ROWS):  # a chunk's rows stay in the cache
        part = slice(first, first + CHUNK_ROWS)
        v = recs[part, :, 1]
        out += _reserve_rows(t, v, now, window, span, sizes[0, part], sizes[1, part])
    return out


CHUNK_ROWS = 128
"""Rows taken at once (a steady 40-lane tick's records, 250 a row, 240 in the span,
load ~7: 1 row 53 us (`overflow_reserve`, one row of these steps), 4: 61, 32: 106, 40:
118, 64: 159, 100: 215, 128: 257, 256: 452; it was 32 while the window maxima took ~1 us
a row and window)."""


def _reserve_rows(
    t: FloatArray,
    v: FloatArray,
    now: float,
    window: float,
    span: float,
    at_target: FloatArray,
    full: FloatArray,
) -> list[Reserve | None]:
    """`overflow_reserve` of each row of values `v` (rows, records), all at the record
    times `t`: its steps over rows (the windows of every record in the span; a row's
    records without a finite value, or without one before them, are not scored).
    Records in time order (as remembered) are read in place, the span as a slice."""
    inspan = np.flatnonzero(t > now - span)
    if not inspan.size:
        return [None] * len(v)
    ok = np.isfinite(v)
    finite = np.where(ok, v, -np.inf)  # a value not finite sizes nothing, overflows never
    span_at: slice | IntArray
    if bool((t[1:] >= t[:-1]).all()):  # in time order: the span is the newest records
        ts, vs, span_at = t, finite, slice(int(inspan[0]), None)
    else:
        order = np.argsort(t, kind="stable")
        ts, vs, span_at = t[order], finite[:, order], inspan
    o = t[inspan]
    start, stop = np.searchsorted(ts, o - window, "left"), np.searchsorted(ts, o)
    reactive = window_max_rows(vs, start, stop)
    replicas = np.maximum(1.0, np.ceil(reactive / at_target[:, None] - 1e-9))
    with np.errstate(invalid="ignore"):
        # -inf (a value not finite) is over no size, as `ok` left it out before.
        over = finite[:, span_at] > replicas * full[:, None] + 1e-9
    over &= reactive > -np.inf
    if not over.any():  # most ticks of most workloads
        return [None] * len(v)
    counts: list[int] = over.sum(axis=1).tolist()
    values = v[:, span_at]
    # The newest of the highest: the last maximum of the overflows in record order.
    last = over.shape[1] - 1 - np.argmax(np.where(over, values, -np.inf)[:, ::-1], axis=1)
    out: list[Reserve | None] = []
    for row, (count, k) in enumerate(zip(counts, last.tolist(), strict=True)):
        if not count:
            out.append(None)
            continue
        top = int(inspan[k])
        out.append(Reserve(float(v[row, top]), now - float(t[top]), count))
    return out
