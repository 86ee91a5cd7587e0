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
reserve. A tick without a finite value neither overflows nor sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuscaler.core.model import FloatArray
from gpuscaler.core.peaks import window_max


@dataclass(frozen=True)
class Reserve:
    peak: float
    """The highest demand of the span that overflowed the reactive sizing's full use."""
    age: float
    """Seconds since that tick."""
    overflows: int
    """Ticks of the span that overflowed."""


def overflow_reserves(
    records: FloatArray,
    now: float,
    window: float,
    span: float,
    at_target: FloatArray,
    full: FloatArray,
) -> list[Reserve | None]:
    """The reserve the tick records of the last `span` seconds call for, for each row of
    `records` (rows, records, 4; time and observed demand first) that share their times,
    in time order (None when no tick overflowed). `at_target`: what one replica of the row
    serves at the target; `full`: at full use, both in the records' unit."""
    rows = records.shape[0]
    t = records[0, :, 0] if rows else np.zeros(0)
    inspan = np.flatnonzero(t > now - span)
    if not inspan.size:
        return [None] * rows
    values = records[:, :, 1]
    v = np.where(np.isfinite(values), values, -np.inf)
    o = t[inspan]
    start, stop = np.searchsorted(t, o - window, "left"), np.searchsorted(t, o, "left")
    reactive = window_max(v, start, stop)
    replicas = np.maximum(1.0, np.ceil(reactive / at_target[:, None] - 1e-9))
    over = (v[:, inspan] > replicas * full[:, None] + 1e-9) & (reactive > -np.inf)
    counts: list[int] = over.sum(axis=1).tolist()
    # The newest of the highest: the last maximum of the overflows in time order.
    last = over.shape[1] - 1 - np.argmax(np.where(over, v[:, inspan], -np.inf)[:, ::-1], axis=1)
    found: list[Reserve | None] = []
    for row, (count, k) in enumerate(zip(counts, last.tolist(), strict=True)):
        top = int(inspan[k])
        found.append(Reserve(float(v[row, top]), now - float(t[top]), count) if count else None)
    return found
