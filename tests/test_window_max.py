"""The window maxima of the skill and of the overflow reserve (issue 20): one function,
`skill.window_max_rows` (a sparse table; `skill.window_max` is its one row), against the
`np.maximum.reduceat` the skill took them with before (the oracle below, main 3ecdbd8's
`skill.window_max_rows` verbatim): the same values, and the same bits wherever a
window's maximum has one value's bits (no equal zeros of both signs, no NaN but numpy's
own); and the skills and reserves made from them the same to the last bit
whichever of a window's equal zeros or NaNs the maximum keeps."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.core import reserve, skill
from gpuscaler.core.model import FloatArray, IntArray, TargetHistory
from gpuscaler.core.skill import (
    Skill,
    assess,
    assess_chunk,
    records,
    remember,
    window_max,
    window_max_rows,
)

WINDOW_MAX_ROWS = window_max_rows
NEGATIVE_NAN = -math.nan  # the sign bit set: what x86 makes of inf - inf
ODD_NAN = float(np.frombuffer(np.uint64(0x7FF8_0000_0000_0123).tobytes(), dtype=np.float64)[0])


def reduceat_max(values: FloatArray, start: IntArray, stop: IntArray) -> FloatArray:
    """The window maxima as the skill took them before (the oracle)."""
    ext = np.concatenate((values, np.full((len(values), 1), -np.inf)), axis=1)
    idx = np.empty(2 * start.size, dtype=np.intp)
    idx[0::2], idx[1::2] = start, stop
    out = np.maximum.reduceat(ext, idx, axis=1)[:, 0::2]
    found: FloatArray = np.where(stop > start, out, -np.inf)
    return found


def same_maxima(got: FloatArray, want: FloatArray) -> bool:
    """Equal values (NaN where NaN), and the same bits wherever the value is neither a
    zero nor a NaN (of those, which one a window keeps depends on the order taken)."""
    if got.shape != want.shape or not np.array_equal(got, want, equal_nan=True):
        return False
    one = (want != 0.0) & ~np.isnan(want)
    return bool(got[one].tobytes() == want[one].tobytes())


def plain(values: FloatArray) -> bool:
    """No negative zero, and no NaN but numpy's own (`np.nan`'s bits, which numpy's
    maximum makes of a NaN it does not keep): every window's maximum has one value's
    bits, however taken."""
    nans = {v.tobytes() for v in values[np.isnan(values)]}
    return (
        nans <= {np.float64(np.nan).tobytes()} and not (np.signbit(values) & (values == 0.0)).any()
    )


def windows(n: int, pairs: list[tuple[int, int]]) -> tuple[IntArray, IntArray]:
    start = np.asarray([a for a, _ in pairs], dtype=np.intp)
    stop = np.asarray([b for _, b in pairs], dtype=np.intp)
    assert ((start >= 0) & (start <= stop) & (stop <= n)).all()
    return start, stop


def check(values: FloatArray, start: IntArray, stop: IntArray) -> None:
    got, want = window_max_rows(values, start, stop), reduceat_max(values, start, stop)
    assert same_maxima(got, want)
    assert got.flags.c_contiguous  # the rows' sums read them in C order
    if plain(values):
        assert got.tobytes() == want.tobytes()
    for row, found in zip(values, got, strict=True):  # one row: the same bits
        assert window_max(row, start, stop).tobytes() == found.tobytes()


@pytest.mark.parametrize(
    ("n", "pairs"),
    [
        (1, [(0, 1), (0, 0), (1, 1)]),  # one value; empty windows
        (8, [(0, 8), (0, 4), (4, 8), (3, 4), (2, 2)]),  # powers of two, the whole row
        (9, [(0, 9), (1, 8), (0, 3), (5, 8), (8, 9)]),  # odd widths, the last value
        (40, [(i, min(40, i + 10)) for i in range(40)]),  # sliding, narrowing at the end
        (40, [(i, i + 10) for i in range(5, 31)]),  # sliding, one width: two slices
        (40, [(i, i + 3) for i in range(0, 20, 2)]),  # one width, every other start
        (30, [(i, i + 9 + i % 2) for i in range(20)]),  # one width class, two widths
        (33, [(0, 33), (0, 17), (16, 33), (31, 33)]),  # a level past the half of the row
        (6, [(0, 0)] * 4),  # nothing to take: -inf everywhere
        (12, [(3, 4)]),  # one window of one value
        (5, []),  # no windows
    ],
)
@pytest.mark.parametrize("kind", ["mixed", "plain", "nan"])
def test_window_maxima_from_the_table_are_the_reduceat_ones(
    n: int, pairs: list[tuple[int, int]], kind: str
) -> None:
    rng = np.random.default_rng(n)
    choices = {
        "mixed": [-np.inf, -0.0, 0.0, 3.0, 7.5, -2.0, 1e308, math.nan, NEGATIVE_NAN, ODD_NAN],
        "plain": [-np.inf, 0.0, 3.0, 7.5, -2.0, 1e308, np.inf],
        "nan": [math.nan, 1.0, 0.0, -5.0],
    }[kind]
    values = rng.choice(choices, size=(4, n))
    values[1] = rng.normal(size=n)
    values[2] = -np.inf  # no finite value: every window -inf
    start, stop = windows(n, pairs)
    check(values, start, stop)


@settings(max_examples=300, deadline=None)
@given(
    rows=st.integers(1, 5),
    n=st.integers(1, 300),
    cuts=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 70)), max_size=40),
    plain_values=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_window_maxima_from_the_table_are_the_reduceat_ones_on_generated_rows(
    rows: int, n: int, cuts: list[tuple[int, int]], plain_values: bool, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    odd = [1.0, 2.0] if plain_values else [-0.0, math.nan, NEGATIVE_NAN, ODD_NAN]
    values = rng.choice([-np.inf, 0.0, np.inf, *odd], size=(rows, n)) + np.where(
        rng.random((rows, n)) < 0.5, rng.normal(size=(rows, n)), 0.0
    )
    pairs = [(a % (n + 1), min(a % (n + 1) + w, n)) for a, w in cuts]
    start, stop = windows(n, pairs)
    check(values, start, stop)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 40),
    n=st.integers(1, 260),
    width=st.integers(1, 40),
    first=st.integers(0, 260),
    count=st.integers(1, 260),
    seed=st.integers(0, 2**32 - 1),
)
def test_windows_one_after_another_of_one_width_are_read_as_slices_with_the_same_maxima(
    rows: int, n: int, width: int, first: int, count: int, seed: int
) -> None:
    width = min(width, n)
    first = min(first, n - width)
    count = min(count, n - width - first + 1)
    start = np.arange(first, first + count, dtype=np.intp)
    stop = start + width
    rng = np.random.default_rng(seed)
    values = rng.choice([0.0, -0.0, math.nan, NEGATIVE_NAN, 1.0, -np.inf], size=(rows, n))
    values += np.where(rng.random((rows, n)) < 0.7, rng.gamma(2.0, 50.0, (rows, n)), 0.0)
    got = window_max_rows(values, start, stop)
    assert same_maxima(got, reduceat_max(values, start, stop))
    assert got.flags.c_contiguous
    # The levels' path (every window gathered): the same bits as the slices.
    levels = window_max_rows(values, np.r_[start, 0], np.r_[stop, 0])[:, :-1]
    assert levels.tobytes() == got.tobytes()


def test_the_slices_are_taken_for_one_width_one_after_another_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[bool] = []
    inner = skill._one_after_another

    def spy(first: IntArray) -> bool:
        seen.append(inner(first))
        return seen[-1]

    monkeypatch.setattr(skill, "_one_after_another", spy)
    values = np.random.default_rng(0).normal(size=(3, 50))
    for pairs, asked, sliced in [
        ([(i, i + 11) for i in range(30)], True, True),
        ([(i, i + 11) for i in range(0, 30, 2)], True, False),
        ([(i, i + 8 + i % 3) for i in range(30)], False, False),  # widths of one level
        ([(i, i + 2 + i % 3) for i in range(30)], False, False),  # levels 1 and 2
        ([(i, i) for i in range(30)], False, False),  # empty
    ]:
        seen.clear()
        start, stop = windows(50, pairs)
        check(values, start, stop)
        assert seen == ([sliced] * 4 if asked else [])  # `check`: the rows, then each of 3


def histories(seed: int, width: int, ticks: int) -> list[tuple[float, list[TargetHistory]]]:
    """Floor histories on one schedule whose values hold zeros of both signs, NaNs of
    other bits and infinities, as well as bursts and ties."""
    rng = np.random.default_rng(seed)
    hs = [TargetHistory() for _ in range(width)]
    now, out = 1_700_000_000.0, []
    odd = [0.0, -0.0, math.nan, NEGATIVE_NAN, ODD_NAN, math.inf, 40.0]
    for i in range(ticks):
        now += 30.0
        for j in range(width):
            value = float(rng.gamma(2.0, 20.0) * (3 if rng.random() < 0.05 else 1))
            if rng.random() < (0.3 if j % 3 == 0 else 0.05):
                value = float(rng.choice(odd))
            has = i >= 10
            base = value if math.isfinite(value) else 40.0
            upper = float(base * rng.uniform(0.6, 1.6)) if has else math.nan
            if has and rng.random() < 0.2:
                upper = float(rng.choice([0.0, -0.0]))
            mean = upper / 1.2 if has else math.nan
            hs[j] = remember(hs[j], now, value, upper, mean, 7500.0)
        out.append((now, list(hs)))
    return out


def same_skill(a: Skill, b: Skill) -> bool:
    if a.origins != b.origins or (a.score is None) != (b.score is None):
        return False
    if a.score is None or b.score is None:
        return True
    if math.isnan(a.score) and math.isnan(b.score):
        return True  # a NaN score's bits: never read (compared, or written as "nan")
    return bool(np.float64(a.score).tobytes() == np.float64(b.score).tobytes())


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # inf - inf: NaN
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("lead", "stab"), [(120.0, 300.0), (30.0, 0.0), (90.0, 61.0)])
def test_skills_are_the_same_bits_whichever_equal_zero_or_nan_the_maxima_keep(
    monkeypatch: pytest.MonkeyPatch, seed: int, lead: float, stab: float
) -> None:
    monkeypatch.setattr(skill, "_MIN_ROWS", 2)
    scored = 0
    for now, hs in histories(seed, 7, 160)[::9]:
        found = []
        for maxima in (WINDOW_MAX_ROWS, reduceat_max):  # `window_max` is its one row
            monkeypatch.setattr(skill, "window_max_rows", maxima)
            found += [
                assess_chunk(np.stack([records(h) for h in hs]), now, lead, stab, 5),
                [assess(h, now, lead, stab, 5) for h in hs],
            ]
        for got in found[:2]:
            for want in found[2:]:
                assert all(same_skill(a, b) for a, b in zip(got, want, strict=True))
        scored += sum(s.score is not None and not math.isnan(s.score) for s in found[0])
    assert scored > 0


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("window", "span"), [(300.0, 7200.0), (45.0, 900.0)])
def test_reserves_are_the_same_whichever_equal_zero_the_maxima_keep(
    monkeypatch: pytest.MonkeyPatch, seed: int, window: float, span: float
) -> None:
    rng = np.random.default_rng(seed)
    t = 1000.0 + 30.0 * np.arange(260)
    recs = np.zeros((6, 260, 4))
    recs[:, :, 0] = t
    recs[:, :, 1] = rng.choice([0.0, -0.0, math.nan, NEGATIVE_NAN, 5.0, 80.0], size=(6, 260))
    now = float(t[-1])
    at, full = [10.0, 0.5, 3.0, 10.0, 0.5, 3.0], [14.0, 0.6, 3.0, 14.0, 0.6, 3.0]
    found = []
    for maxima in (WINDOW_MAX_ROWS, reduceat_max):
        monkeypatch.setattr(reserve, "window_max_rows", maxima)
        monkeypatch.setattr(skill, "window_max_rows", maxima)  # `window_max`'s
        alone = [
            reserve.overflow_reserve(r, now, window, span, a, f)
            for r, a, f in zip(recs, at, full, strict=True)
        ]
        found.append((reserve.overflow_reserve_chunk(recs, now, window, span, at, full), alone))
    assert found[0] == found[1]
    assert found[0][0] == found[0][1]
    assert any(r is not None for r in found[0][0])
