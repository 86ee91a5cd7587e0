"""The skill's level floor at the forecast's cost over rows (gpuscaler.core.at_cost):
each row's c is the one the old step-by-step bisection found (tests/skill_reference.py)
to the last bit, on tables of edge cases (ties, equal breakpoints, zero and negative
extra, NaN, inf, sums near overflow, subnormals) and on generated rows; and the rows'
sums are taken only in the steps that fall in the band around the root."""

from __future__ import annotations

import numpy as np
import pytest
import skill_reference
from floor_reference import at_cost as exact_at_cost
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.core import at_cost
from gpuscaler.core.at_cost import bisect_rows
from gpuscaler.core.model import FloatArray, IntArray

Case = tuple[FloatArray, FloatArray, FloatArray]


def same_bits(got: FloatArray, want: FloatArray) -> bool:
    return got.shape == want.shape and got.tobytes() == want.tobytes()


def check(reactive: FloatArray, base: FloatArray, extra: FloatArray) -> None:
    with np.errstate(all="ignore"):
        want = skill_reference.bisect_rows(reactive, base, extra)
        got = bisect_rows(reactive, base, extra)
    assert same_bits(got, want), (got, want)


def rows_of(rng: np.random.Generator, rows: int, n: int, kind: str) -> Case:
    """Rows like the skill's: reactive capacities, a level base around them, the extra
    the forecast spent (a share of what lifts the base over reactive)."""
    scale = 10.0 ** rng.integers(-6, 8, (rows, 1))
    reactive = rng.gamma(2.0, 1.0, (rows, n)) * scale
    base = reactive + rng.normal(0.0, 1.0, (rows, n)) * scale
    if kind == "ties":  # breakpoints that tie (and often equal 0)
        reactive, base = np.round(reactive), np.round(base)
    elif kind == "flat":  # every breakpoint the same
        base = reactive - scale
    elif kind == "mixed":  # sizes apart by many orders within a row
        reactive *= 10.0 ** rng.integers(-8, 8, (rows, n))
    lift = np.maximum(0.0, base - reactive).sum(axis=1)
    extra = lift * rng.uniform(0.0, 2.0, rows)
    extra[rng.random(rows) < 0.2] = 0.0
    return reactive, base, extra


def edge_cases() -> list[Case]:
    """One row each (and all of them stacked where their lengths agree)."""
    nan, inf = np.nan, np.inf
    found: list[tuple[list[float], list[float], float]] = [
        ([1.0, 2.0, 3.0], [1.5, 2.5, 2.0], 1.0),
        ([1.0, 2.0, 3.0], [1.5, 2.5, 2.0], 0.0),  # zero extra: c at the lowest breakpoint
        ([1.0, 2.0, 3.0], [1.5, 2.5, 2.0], -0.0),
        ([1.0, 2.0, 3.0], [1.5, 2.5, 2.0], -1.0),  # negative: yes at every step
        ([1.0, 2.0, 3.0], [1.5, 2.5, 2.0], -1e-300),
        ([1.0, 2.0, 3.0], [1.5, 2.5, 2.0], 1e-300),  # extra under the band's margin
        ([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], 0.5),  # equal breakpoints, all 0
        ([0.0, 0.0, 0.0], [-0.0, 0.0, -0.0], 0.0),
        ([2.0, 2.0, 5.0], [1.0, 1.0, 4.0], 3.0),  # breakpoints that tie
        ([0.1, 0.2, 0.3], [0.3, 0.1, 0.2], 0.6),  # decimals: sums that round
        ([7.0], [9.0], 2.0),  # one origin
        ([7.0], [9.0], 0.0),
        ([1e300, 2e300, 3e300], [1e300, 1e300, 1e300], 1e300),  # sums near overflow
        ([1.7e308, 1.7e308, 1.0], [-1.7e308, 1.0, 1.0], 1.0),  # breakpoints overflow
        ([1e308, 1e308, 1e308], [1e308, 1e308, 1e308], -1.0),  # the sum overflows
        ([5e-324, 1e-310, 0.0], [1e-310, 0.0, 5e-324], 1e-315),  # subnormals
        ([1e16, 1.0, 3.0], [1e16, 2.0, 1.0], 1.0),  # cancellation in the total
        ([1.0, nan, 2.0], [2.0, 3.0, 1.0], 1.0),  # not finite: the old steps
        ([1.0, 2.0, 3.0], [2.0, nan, 1.0], 1.0),
        ([1.0, 2.0, 3.0], [2.0, 3.0, 1.0], nan),
        ([1.0, 2.0, 3.0], [2.0, 3.0, 1.0], inf),
        ([1.0, inf, 3.0], [2.0, 3.0, 1.0], 1.0),
        ([1.0, 2.0, 3.0], [2.0, -inf, 1.0], 1.0),
        ([1.0, 2.0, 3.0], [2.0, inf, 1.0], 1.0),
    ]
    return [
        (np.array([r], dtype=np.float64), np.array([b], dtype=np.float64), np.array([e]))
        for r, b, e in found
    ]


@pytest.mark.parametrize("case", edge_cases())
def test_each_edge_case_lands_on_the_old_bisections_c_to_the_last_bit(case: Case) -> None:
    check(*case)


def test_edge_cases_stacked_as_rows_land_on_the_old_bisections_c() -> None:
    """Regular and irregular rows together: each row's c is its own."""
    threes = [case for case in edge_cases() if case[0].shape[1] == 3]
    check(*(np.concatenate(part) for part in zip(*threes, strict=True)))


@pytest.mark.parametrize("kind", ["normal", "ties", "flat", "mixed"])
@pytest.mark.parametrize("n", [1, 2, 3, 8, 40, 126, 250])
def test_rows_like_the_skills_land_on_the_old_bisections_c(n: int, kind: str) -> None:
    rng = np.random.default_rng(n)
    for _ in range(6):
        check(*rows_of(rng, int(rng.integers(1, 24)), n, kind))


def test_every_regular_row_is_also_the_plain_bisections_c_with_a_sum_a_step() -> None:
    """The first bisection (tests/floor_reference.py: a row's sum at every step)."""
    rng = np.random.default_rng(5)
    for kind in ("normal", "ties", "mixed"):
        reactive, base, extra = rows_of(rng, 30, 60, kind)
        got = np.maximum(reactive, base + bisect_rows(reactive, base, extra)[:, None])
        for row, r, b, e in zip(got, reactive, base, extra, strict=True):
            assert same_bits(row, exact_at_cost(r, b, float(e)))


FLOATS = st.one_of(
    st.floats(-1e6, 1e6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, 5e-324, 1e308, -1e308, np.nan, np.inf]),
)


@settings(max_examples=300, deadline=None)
@given(
    rows=st.integers(1, 5),
    n=st.integers(1, 12),
    data=st.data(),
)
def test_generated_rows_of_any_floats_land_on_the_old_bisections_c(
    rows: int, n: int, data: st.DataObject
) -> None:
    draw = data.draw
    cells = st.lists(FLOATS, min_size=rows * n, max_size=rows * n)
    reactive = np.array(draw(cells)).reshape(rows, n)
    base = np.array(draw(cells)).reshape(rows, n)
    extra = np.array(draw(st.lists(FLOATS, min_size=rows, max_size=rows)))
    check(reactive, base, extra)


@settings(max_examples=300, deadline=None)
@given(
    rows=st.integers(1, 6),
    n=st.integers(1, 300),
    seed=st.integers(0, 2**32 - 1),
    kind=st.sampled_from(["normal", "ties", "flat", "mixed"]),
    near=st.integers(-3, 3),
)
def test_generated_skill_like_rows_land_on_the_old_bisections_c(
    rows: int, n: int, seed: int, kind: str, near: int
) -> None:
    """`near` moves extra by a few ulps: roots just off a breakpoint, or on it."""
    reactive, base, extra = rows_of(np.random.default_rng(seed), rows, n, kind)
    check(reactive, base, extra + near * np.spacing(extra))


def test_the_rows_sums_are_taken_only_in_the_band_in_the_last_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows like a steady tick's (126 origins): the sums in a few of the 40 steps, and
    no step at all for a row with a negative extra."""
    taken: list[IntArray] = []
    summed_over = at_cost.summed_over

    def spy(
        reactive: FloatArray,
        base: FloatArray,
        total: FloatArray,
        extra: FloatArray,
        c: FloatArray,
        rows: IntArray,
    ) -> at_cost.Bools:
        taken.append(rows.copy())
        return summed_over(reactive, base, total, extra, c, rows)

    reactive, base, extra = rows_of(np.random.default_rng(3), 19, 126, "normal")
    extra[0] = -1.0
    want = skill_reference.bisect_rows(reactive, base, extra)
    monkeypatch.setattr(at_cost, "summed_over", spy)
    got = bisect_rows(reactive, base, extra)
    assert same_bits(got, want)
    assert 0 < len(taken) <= 15
    assert sum(len(rows) for rows in taken) <= 19 * 10
    assert all(0 not in rows for rows in taken)  # the row with a negative extra


def test_irregular_rows_take_the_old_steps_and_regular_rows_do_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counted: list[int] = []
    stepped = at_cost.stepped

    def spy(reactive: FloatArray, *args: FloatArray) -> FloatArray:
        counted.append(len(reactive))
        return stepped(reactive, *args)

    monkeypatch.setattr(at_cost, "stepped", spy)
    reactive, base, extra = rows_of(np.random.default_rng(4), 6, 20, "normal")
    check(reactive, base, extra)
    assert counted == []
    reactive[2, 5], extra[4] = np.nan, np.inf
    check(reactive, base, extra)
    assert counted == [2]
