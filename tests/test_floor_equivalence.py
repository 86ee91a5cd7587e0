"""The replica floor's skill assessment, overflow reserve and record keeping, made cheaper
per tick (records kept as an array, windows found by search in time order, the level's
rows filled by index, the bisection's steps answered from prefix sums unless too close to
call), give exactly what they gave before (tests/floor_reference.py, the code they
replaced): the same skill score to the last bit, the same reserve, the same bisection."""

from __future__ import annotations

import math

import numpy as np
import pytest
from floor_reference import assess as old_assess
from floor_reference import at_cost as old_at_cost
from floor_reference import overflow_reserve as old_overflow_reserve
from floor_reference import remember as old_remember

from gpuscaler.core.model import FloatArray, TargetHistory
from gpuscaler.core.reserve import overflow_reserve
from gpuscaler.core.skill import _at_cost, assess, records, remember, window_max

TICK = 30.0


def history(seed: int, n: int, keep: float = 7500.0) -> list[TargetHistory]:
    """The histories a floor builds over `n` ticks of a random workload: bursts, calm,
    ticks without a forecast at first, an occasional missed tick."""
    rng = np.random.default_rng(seed)
    h, out, now = TargetHistory(), [], 1_700_000_000.0
    base = rng.uniform(5, 500)
    for i in range(n):
        now += TICK * (2 if rng.random() < 0.05 else 1)
        value = float(base * rng.gamma(2 + seed % 4, 0.5) * (3 if rng.random() < 0.04 else 1))
        if rng.random() < 0.1:
            value = float(round(value))  # ties between windows' maxima
        forecast = i >= 10 and rng.random() > 0.02
        upper = float(value * rng.uniform(0.6, 1.6)) if forecast else math.nan
        mean = upper / rng.uniform(1.0, 1.4) if forecast else math.nan
        h = remember(h, now, value, upper, mean, keep)
        out.append(h)
    return out


def same_skill(h: TargetHistory, now: float, lead: float, stab: float, span: float) -> None:
    new = assess(h, now, lead, stab, 5, span)
    old = old_assess(h.seen, now, lead, stab, 5, span)
    assert new.origins == old.origins
    assert (new.score is None) == (old.score is None)
    if new.score is not None and old.score is not None:
        assert np.float64(new.score).tobytes() == np.float64(old.score).tobytes()


@pytest.mark.parametrize("seed", range(6))
def test_the_skill_is_the_same_to_the_last_bit_at_every_tick_of_a_replay(seed: int) -> None:
    for h in history(seed, 330)[::3]:
        now = h.seen[-1][0]
        same_skill(h, now, 120.0, 300.0, 3900.0)
        same_skill(h, now, 90.0, 60.0, math.inf)


@pytest.mark.parametrize(
    ("lead", "stab", "span"),
    [(120.0, 300.0, 3900.0), (30.0, 0.0, 600.0), (600.0, 30.0, math.inf), (45.0, 75.0, 1e9)],
)
def test_the_skill_is_the_same_for_windows_on_and_off_the_tick_grid(
    lead: float, stab: float, span: float
) -> None:
    for h in history(7, 200)[20::7]:
        same_skill(h, h.seen[-1][0], lead, stab, span)


def test_the_skill_is_the_same_for_records_out_of_time_order_and_without_their_array() -> None:
    h = history(3, 150)[-1]
    rng = np.random.default_rng(0)
    shuffled = TargetHistory(seen=tuple(h.seen[i] for i in rng.permutation(len(h.seen))))
    now = h.seen[-1][0]
    for lead, stab in [(120.0, 300.0), (60.0, 90.0)]:
        same_skill(shuffled, now, lead, stab, 3900.0)
        same_skill(TargetHistory(seen=h.seen), now, lead, stab, 3900.0)


def test_remember_keeps_the_same_records_and_their_array_beside_them() -> None:
    h_new = h_old = TargetHistory()
    rng = np.random.default_rng(5)
    now = 0.0
    for i in range(300):
        now += TICK * (1 + (i % 17 == 0))
        args = (now, float(rng.normal(100, 30)), float(rng.normal(120, 30)), 1.0, 1800.0)
        h_new, h_old = remember(h_new, *args), old_remember(h_old, *args)
        assert h_new.seen == h_old.seen
        assert h_new.seen_rows is not None
        assert np.array_equal(h_new.seen_rows, np.asarray(h_old.seen, dtype=np.float64))
    # A stale array (a history whose records were replaced) is not trusted.
    stale = TargetHistory(seen=h_old.seen[:5], seen_rows=h_new.seen_rows)
    assert np.array_equal(records(stale), np.asarray(h_old.seen[:5]))


def test_remember_drops_records_out_of_time_order_as_before() -> None:
    """Records not in time order (kept ones not all the newest): the same records, and
    the array beside them holds them in the same order."""
    rng = np.random.default_rng(9)
    seen = tuple(
        (float(t), float(v), 1.0, 1.0)
        for t, v in zip(rng.permutation(60) * TICK, rng.normal(100, 30, 60), strict=True)
    )
    for keep in (1e9, 900.0, 300.0, 1.0):
        args = (60 * TICK, 5.0, 6.0, 1.0, keep)
        new, old = (
            remember(TargetHistory(seen=seen), *args),
            old_remember(TargetHistory(seen=seen), *args),
        )
        assert new.seen == old.seen
        assert np.array_equal(records(new), np.asarray(old.seen, dtype=np.float64))
        assert new.seen_rows is not None and np.array_equal(new.seen_rows, records(new))


def reserve_cases() -> list[tuple[tuple[tuple[float, float, float, float], ...], float]]:
    cases = []
    for seed in range(8):
        rng = np.random.default_rng(100 + seed)
        n = int(rng.integers(0, 260))
        t = 1000.0 + TICK * np.cumsum(rng.integers(1, 3, n))
        v = rng.gamma(2, 60, n) * np.where(rng.random(n) < 0.05, 4.0, 1.0)
        v[rng.random(n) < 0.05] = np.nan
        v[rng.random(n) < 0.02] = np.inf
        v[rng.random(n) < 0.1] = 100.0  # equal peaks: the newest is reported
        seen = tuple((float(a), float(b), 0.0, 0.0) for a, b in zip(t, v, strict=True))
        if seed % 3 == 0:
            seen = tuple(seen[i] for i in rng.permutation(n))
        cases.append((seen, float(t[-1]) if n else 1000.0))
    return cases


@pytest.mark.parametrize(("seen", "now"), reserve_cases())
@pytest.mark.parametrize(("window", "span"), [(300.0, 7200.0), (45.0, 900.0), (0.0, 600.0)])
def test_the_overflow_reserve_is_the_same(
    seen: tuple[tuple[float, float, float, float], ...], now: float, window: float, span: float
) -> None:
    for at_target, full in [(50.0, 70.0), (80.0, 80.0), (200.0, 250.0)]:
        old = old_overflow_reserve(seen, now, window, span, at_target, full)
        assert overflow_reserve(seen, now, window, span, at_target, full) == old
        rows = np.asarray(seen, dtype=np.float64).reshape(-1, 4)
        assert overflow_reserve(rows, now, window, span, at_target, full) == old


def at_cost_cases() -> list[tuple[FloatArray, FloatArray, float]]:
    rng = np.random.default_rng(11)
    cases = []
    for i in range(120):
        n = int(rng.integers(1, 300))
        scale = 10.0 ** rng.integers(-3, 7)
        reactive = rng.gamma(2, 1, n) * scale
        base = reactive + rng.normal(0, 1, n) * scale * (0.0 if i % 11 == 0 else 1.0)
        if i % 5 == 0:
            base = np.round(base)  # breakpoints that tie
        extra = float(np.maximum(0.0, base - reactive).sum()) * rng.uniform(0.0, 2.0)
        cases.append((reactive, base, 0.0 if i % 7 == 0 else extra))
    cases.append((np.array([1.0, np.nan]), np.array([2.0, 3.0]), 1.0))  # not finite: arrays
    cases.append((np.array([0.0, 0.0]), np.array([-0.0, 0.0]), 0.0))
    return cases


def test_the_bisection_lands_on_the_same_capacity_to_the_last_bit() -> None:
    for reactive, base, extra in at_cost_cases():
        new, old = _at_cost(reactive, base, extra), old_at_cost(reactive, base, extra)
        assert new.tobytes() == old.tobytes(), (reactive.size, extra)


@pytest.mark.parametrize(
    ("values", "start", "stop", "expected"),
    [
        ([1.0, 5.0, 2.0], [0, 1, 2], [3, 2, 3], [5.0, 5.0, 2.0]),
        ([1.0, 5.0, 2.0], [1, 3], [1, 3], [-np.inf, -np.inf]),  # empty windows
        ([1.0, np.nan, 2.0], [0, 2], [3, 3], [np.nan, 2.0]),  # NaN kept, as np.max keeps it
        ([], [], [], []),
    ],
)
def test_window_max_takes_each_windows_highest(
    values: list[float], start: list[int], stop: list[int], expected: list[float]
) -> None:
    got = window_max(np.asarray(values, dtype=np.float64), np.asarray(start), np.asarray(stop))
    assert np.array_equal(got, np.asarray(expected, dtype=np.float64), equal_nan=True)
