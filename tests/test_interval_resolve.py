"""The adaptive interval's check of the points observed since the last tick
(`intervals.resolve`, all pending intervals of one length at once) gives exactly what
checking them one by one gave (the loop it replaced, kept here as the reference)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.core.forecast.intervals import ACI_GAMMA, ACI_LEVELS, resolve
from gpuscaler.core.model import FloatArray, IntervalState, IssuedInterval

STEP = 10.0


def reference(
    state: IntervalState | None, row: FloatArray, now: float, step: float, nominal: float
) -> IntervalState:
    """`resolve` as it was: one pending interval at a time."""
    if state is None:
        return IntervalState(level=nominal, checked_at=now)
    points = misses = 0
    keep: list[IssuedInterval] = []
    for issued in state.pending:
        taus = issued.origin + issued.step * np.arange(1, len(issued.lower) + 1)
        new = (taus > state.checked_at + 1e-9) & (taus <= now + 1e-9)
        idx = len(row) - 1 - np.round((now - taus[new]) / step).astype(np.int64)
        inside = idx >= 0
        y = row[idx[inside]]
        lo, hi = np.asarray(issued.lower)[new][inside], np.asarray(issued.upper)[new][inside]
        seen = np.isfinite(y)
        points += int(seen.sum())
        misses += int(((y < lo) | (y > hi))[seen].sum())
        if taus[-1] > now + 1e-9:
            keep.append(issued)
    level = state.level
    if points:
        level += ACI_GAMMA * (misses / points - (1.0 - nominal))
        level = min(max(level, ACI_LEVELS[0]), ACI_LEVELS[1])
    return IntervalState(level, now, tuple(keep), state.points + points, state.misses + misses)


def _issued(origin: float, lower: list[float], width: float) -> IssuedInterval:
    return IssuedInterval(origin, STEP, tuple(lower), tuple(v + width for v in lower))


ROW = np.array([5.0, 6.0, math.nan, 8.0, 9.0, 30.0, 1.0, 7.0])
NOW = 1000.0


@pytest.mark.parametrize(
    ("pending", "checked_at"),
    [
        ((), 970.0),  # nothing pending: the level stays
        ((_issued(970.0, [4.0, 5.0, 6.0], 3.0),), 970.0),  # fully observed: dropped
        ((_issued(990.0, [4.0, 5.0, 6.0], 3.0),), 990.0),  # partly observed: kept
        ((_issued(900.0, [4.0] * 12, 3.0),), 900.0),  # reaches before the window
        ((_issued(960.0, [0.0, 0.0, 0.0, 0.0], 1.0),), 970.0),  # misses, a NaN point
        (  # two lengths, order kept
            (
                _issued(980.0, [4.0, 5.0, 6.0], 3.0),
                _issued(950.0, [1.0] * 6, 100.0),
                _issued(990.0, [7.0, 7.0, 7.0, 7.0], 0.5),
            ),
            975.0,
        ),
        ((_issued(970.0, [], 1.0),), 970.0),  # an empty interval checks nothing
    ],
)
def test_checking_pending_intervals_at_once_gives_what_one_by_one_gave(
    pending: tuple[IssuedInterval, ...], checked_at: float
) -> None:
    state = IntervalState(0.9, checked_at, pending, 7, 2)
    if any(not p.lower for p in pending):  # the loop could not check an empty interval
        got = resolve(state, ROW, NOW, STEP, 0.9)
        assert (got.points, got.misses, got.pending) == (7, 2, ())
        return
    assert resolve(state, ROW, NOW, STEP, 0.9) == reference(state, ROW, NOW, STEP, 0.9)


def test_misses_move_the_level_and_are_counted() -> None:
    state = IntervalState(0.9, 970.0, (_issued(960.0, [0.0, 0.0, 0.0, 0.0], 1.0),))
    got = resolve(state, ROW, NOW, STEP, 0.9)
    assert (got.points, got.misses) == (3, 2)  # 980, 990, 1000: 30 and 7 miss [0, 1], 1 not
    assert got.level == pytest.approx(0.9 + ACI_GAMMA * (2 / 3 - 0.1))
    assert got.pending == ()  # its last point (1000) is observed


def test_an_empty_row_checks_nothing() -> None:
    state = IntervalState(0.9, 970.0, (_issued(960.0, [0.0] * 4, 1.0),))
    got = resolve(state, np.array([]), NOW, STEP, 0.9)
    assert got == reference(state, np.array([]), NOW, STEP, 0.9)


@settings(max_examples=200, deadline=None)
@given(
    origins=st.lists(st.integers(0, 40), min_size=0, max_size=12),
    lengths=st.lists(st.integers(1, 8), min_size=12, max_size=12),
    checked=st.integers(0, 40),
    seed=st.integers(0, 2**16),
)
def test_resolve_matches_the_one_by_one_check_on_random_states(
    origins: list[int], lengths: list[int], checked: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    row = rng.uniform(0, 10, 30)
    row[rng.random(30) < 0.1] = math.nan
    now = 1000.0
    pending = tuple(
        _issued(now - 10.0 * o, list(rng.uniform(0, 10, n)), float(rng.uniform(0, 4)))
        for o, n in zip(origins, lengths, strict=False)
    )
    state = IntervalState(float(rng.uniform(0.5, 0.99)), now - 10.0 * checked, pending, 3, 1)
    assert resolve(state, row, now, STEP, 0.9) == reference(state, row, now, STEP, 0.9)
