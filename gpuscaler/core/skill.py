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

Ticks without a forecast (NaN bound: too little history) are observed, not scored; a
tick without a finite observed value is missing from every window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuscaler.core.model import BoolArray, FloatArray, IntArray
from gpuscaler.core.peaks import window_max


@dataclass(frozen=True, slots=True)
class Skill:
    score: float | None
    """None until enough origins are scored."""
    origins: int


def assess(
    records: FloatArray,
    now: float,
    lead: float,
    stabilization: float,
    min_origins: int,
    span: float = np.inf,
) -> list[Skill]:
    """The forecast's skill over the origins of the last `span` seconds, for each row of
    `records` (rows, records, 4): tick records (time, observed, upper bound, mean peak)
    that share their times, in time order."""
    t = records[0, :, 0] if records.shape[0] else np.zeros(0)
    values = records[:, :, 1]
    at = np.flatnonzero((t + lead <= now) & (t > now - span))
    if not at.size:
        return [Skill(None, 0)] * records.shape[0]
    o = t[at]
    start = np.searchsorted(t, o - stabilization, "left")
    mid = np.searchsorted(t, o, "right")
    end = np.searchsorted(t, o + lead, "right")
    finite = np.isfinite(values)
    v = np.where(finite, values, -np.inf)
    reactive, need = window_max(v, start, mid), window_max(v, mid, end)
    level = _window_means(values, finite, start, mid)
    upper, mean = records[:, at, 2], records[:, at, 3]
    scored = np.isfinite(upper) & np.isfinite(mean) & (reactive > -np.inf) & (need > -np.inf)
    n = scored.sum(axis=1)
    # Unscored origins count for nothing: every capacity and need 0 there.
    reactive, need, level, upper, mean = (
        np.where(scored, x, 0.0) for x in (reactive, need, level, upper, mean)
    )
    predictive = np.maximum(reactive, upper)
    extra = (predictive - reactive).sum(axis=1)
    flat = reactive + np.where(scored, (extra / np.maximum(n, 1))[:, None], 0.0)
    base = level + (upper - mean)
    levelled = np.maximum(reactive, base + shift_at_cost(reactive, base, extra, scored)[:, None])
    short_r = _shortfall(need, reactive)
    others = np.minimum(_shortfall(need, flat), _shortfall(need, levelled))
    with np.errstate(divide="ignore", invalid="ignore"):
        scores = (others - _shortfall(need, predictive)) / short_r
    found = []
    for count, short, score in zip(n.tolist(), short_r.tolist(), scores.tolist(), strict=True):
        if count < min_origins:
            found.append(Skill(None, count))
        else:
            found.append(Skill(0.0 if short <= 1e-9 else score, count))
    return found


def in_fallback(fallback: bool, skill: Skill, below: float, above: float) -> bool:
    """Whether the floor steps back to reactive (`fallback`: whether it had): skill under
    `below` engages, over `above` returns (hysteresis). Until enough origins are scored
    the forecast has proven nothing: reactive."""
    if skill.score is None:
        return True
    if fallback:
        return skill.score < above
    return skill.score < below


def _window_means(
    values: FloatArray, counted: BoolArray, start: IntArray, stop: IntArray
) -> FloatArray:
    """The mean of the counted values of each row over each window [start, stop) (NaN
    where none is counted), from running sums of the values and of the counts."""
    rows, n = values.shape
    running = np.zeros((2, rows, n + 1))
    running[0, :, 1:] = np.where(counted, values, 0.0)
    running[1, :, 1:] = counted
    np.cumsum(running, axis=2, out=running)
    sums, counts = running[:, :, stop] - running[:, :, start]
    with np.errstate(divide="ignore", invalid="ignore"):
        means: FloatArray = sums / counts
    return means


def shift_at_cost(
    reactive: FloatArray, base: FloatArray, extra: FloatArray, scored: BoolArray
) -> FloatArray:
    """For each row, the c at which max(reactive, base + c) costs `extra` more than
    `reactive` over the scored origins: the root of g(c) = sum(max(0, c - d)) = extra,
    d = reactive - base. g is piecewise linear, rising by one per breakpoint below c, so
    the root lies on the segment after the last breakpoint where g is at most `extra`
    (extra >= 0; the lowest breakpoint where it is 0)."""
    d = np.sort(np.where(scored, reactive - base, np.inf), axis=1)
    counted = np.isfinite(d)
    d0 = np.where(counted, d, 0.0)
    below = np.cumsum(d0, axis=1) - d0  # the sum of the breakpoints before each
    at_break = np.where(counted, np.arange(d.shape[1]) * d0 - below, np.inf)
    k = np.maximum((at_break <= extra[:, None]).sum(axis=1), 1)
    summed = np.take_along_axis(below + d0, (k - 1)[:, None], axis=1)[:, 0]
    shift: FloatArray = (extra + summed) / k
    return shift


def _shortfall(need: FloatArray, capacity: FloatArray) -> FloatArray:
    """The shortfall of each row: sum(max(0, need - capacity))."""
    found: FloatArray = np.maximum(0.0, need - capacity).sum(axis=1)
    return found
