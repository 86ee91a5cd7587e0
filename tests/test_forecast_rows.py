"""The forecast's per-row work done over rows at once (issue 20, fb8) gives what it gave
before: the fit states reused or refitted in one pass over the rows (`refit_or_reuse`
against its 3ecdbd8 self, tests/engines_reference.py), and the adaptive intervals
checked and issued in one pass, one state a series and tick (`check_rows` then
`issue_checked`, against `resolve_rows` then `issue_rows` and the one-by-one oracle)."""

from __future__ import annotations

import dataclasses

import engines_reference as before
import forecast_reference as old
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_forecast_lazy import come_back
from test_interval_resolve import reference as resolve_one

from gpuscaler.core.forecast.engines import Fitted, LeastSquaresArima, refit_or_reuse
from gpuscaler.core.forecast.intervals import (
    check_rows,
    issue_checked,
    issue_rows,
    resolve_rows,
)
from gpuscaler.core.model import FitState, FloatArray, IntervalState, IssuedInterval

STEP = 10.0
NOW = 10_000.0
REFIT = 300.0


def _fitted(f: Fitted) -> tuple[bytes, ...]:
    modulus = f.modulus if f.modulus is not None else np.empty(0)
    return tuple(a.tobytes() for a in (f.intercept, f.phi, f.sigma2, modulus))


def _states(states: dict[str, FitState]) -> list[tuple[object, ...]]:
    """Every kept state, field by field (the compare=False ones too), in the dict's order."""
    return [
        (k, *(getattr(s, f.name) for f in dataclasses.fields(s)), id(s)) for k, s in states.items()
    ]


def _prior(rng: np.random.Generator, keys: list[str | None], p: int) -> dict[str, FitState]:
    """Kept states of several kinds: young, old (refit), another order, no modulus, an
    interval to carry on; some keys have none."""
    out: dict[str, FitState] = {}
    interval = IntervalState(0.87, NOW - STEP, (), 4, 1)
    for key in keys:
        if key is None:
            continue
        way = int(rng.integers(0, 6))
        phi = tuple(rng.normal(0, 0.2, p if way != 3 else p + 1).tolist())
        fitted_at = NOW - (REFIT + 1 if way == 1 else rng.uniform(0, REFIT - 1))
        modulus = None if way == 4 else float(rng.uniform(0.1, 0.9))
        if way == 5:
            continue  # no kept state
        out[key] = FitState(
            fitted_at,
            float(rng.normal()),
            phi,
            float(rng.uniform(0.1, 2)),
            interval if rng.random() < 0.5 else None,  # carried on at a refit
            modulus=modulus,
        )
    return out


Refit = tuple[Fitted, dict[str, FitState], int]


def _same_as_before(
    engine: LeastSquaresArima, hist: FloatArray, keys: list[str | None], prior: dict[str, FitState]
) -> tuple[Refit, Refit]:
    """`refit_or_reuse` now and at 3ecdbd8 on the same rows: equal coefficients (bits),
    refit counts and kept states (every field, in the same order)."""
    got = refit_or_reuse(engine, hist, keys, prior, NOW, REFIT)
    want = before.refit_or_reuse(engine, hist, keys, prior, NOW, REFIT)
    assert _fitted(got[0]) == _fitted(want[0])
    assert got[2] == want[2]
    assert [s[:-1] for s in _states(got[1])] == [s[:-1] for s in _states(want[1])]
    return got, want


@pytest.mark.parametrize(
    "keys",
    [
        ["a", "b", "c", "d"],
        ["a", None, "c", None],
        [None, None],
        ["a", "b", "a"],  # a key twice
        ["solo"],
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_refit_or_reuse_in_one_pass_keeps_what_it_kept_before(
    keys: list[str | None], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    engine = LeastSquaresArima(3, 1)
    hist = np.cumsum(rng.normal(0, 1, (len(keys), 60)), axis=1) + 50.0
    prior = _prior(rng, keys, engine.p)
    got, want = _same_as_before(engine, hist, keys, prior)
    reused = [k for k in got[1] if got[1][k] is prior.get(k)]
    assert reused == [k for k in want[1] if want[1][k] is prior.get(k)]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 9))
def test_refit_or_reuse_on_generated_states_keeps_what_it_kept_before(seed: int, rows: int) -> None:
    rng = np.random.default_rng(seed)
    engine = LeastSquaresArima(int(rng.integers(1, 4)), int(rng.integers(0, 2)))
    keys: list[str | None] = [
        None if rng.random() < 0.2 else f"k{int(rng.integers(0, rows + 2))}" for _ in range(rows)
    ]
    hist = rng.normal(50, 5, (rows, 40))
    hist[rng.random(hist.shape) < 0.1] = np.nan
    prior = _prior(rng, keys, engine.p)
    _same_as_before(engine, hist, keys, prior)


def _full(s: IntervalState | None) -> tuple[object, ...]:
    """A state as its reader sees it, the bounds' bits and signs included."""
    assert s is not None
    return (
        s.level,
        s.checked_at,
        s.points,
        s.misses,
        tuple(
            (p.origin, p.step, np.array(p.lower).tobytes(), np.array(p.upper).tobytes())
            for p in s.pending
        ),
    )


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 12), ticks=st.integers(1, 7))
def test_intervals_checked_and_issued_in_one_pass_follow_the_check_then_the_issue(
    seed: int, rows: int, ticks: int
) -> None:
    """Over several ticks, states coming back in every way a batch meets them (fresh,
    emptied, reissued, tuple-only, an equal layout in another object, the batch's layout
    checked at another time): `check_rows`' figures are `resolve_rows`' states', and
    `issue_checked` gives each row what `issue_rows` of those states gives, and what the
    one-by-one oracle gives."""
    rng = np.random.default_rng(seed)
    steps = int(rng.integers(1, 5))
    batch: list[IntervalState | None] = [None] * rows
    alone: list[IntervalState | None] = [None] * rows
    now = NOW
    for _ in range(ticks):
        hist = rng.normal(50, 15, (rows, 12))
        hist[rng.random(hist.shape) < 0.1] = np.nan
        checked = check_rows(batch, hist, now, STEP, 0.9)
        resolved = resolve_rows(batch, hist, now, STEP, 0.9)
        alone_checked = [resolve_one(s, hist[r], now, STEP, 0.9) for r, s in enumerate(alone)]
        assert resolved == alone_checked
        figures = list(zip(checked.level, checked.points, checked.misses, strict=True))
        assert figures == [(s.level, s.points, s.misses) for s in resolved]
        lower = rng.normal(50, 10, (rows, steps))
        lower[rng.random(lower.shape) < 0.2] = -0.0
        upper = lower + rng.uniform(0, 10, (rows, steps))
        issued = issue_checked(checked, lower, upper, STEP)
        two_step = issue_rows(resolved, lower, upper, STEP)
        alone = [old.issue(s, lower[r], upper[r], STEP) for r, s in enumerate(alone_checked)]
        assert [_full(s) for s in issued] == [_full(s) for s in two_step]
        assert [_full(s) for s in issued] == [_full(s) for s in alone]
        for made in issued:  # what the next check reads instead of the tuples
            assert made.layout is not None and made.bounds is not None
            assert not made.bounds.flags.writeable
            assert made.bounds.shape == (2, sum(size for _, _, size in made.layout))
        batch = list(issued)
        come_back(rng, batch, alone, lower, upper, now)
        now += 30.0


def test_rows_of_one_group_out_of_order_get_their_own_intervals_issued_now() -> None:
    """A group of every row but not in row order (a tuple-only state grouped after one
    with an equal layout object): each row gets its own row of the intervals issued now,
    not the block's row at its place in the group."""
    pending = (IssuedInterval(NOW - 30, STEP, (1.0,) * 6, (9.0,) * 6),)
    loose = IntervalState(0.9, NOW - 30, pending)  # no layout: read from its tuples
    laid = issue_rows([IntervalState(0.9, NOW - 30)], np.ones((1, 6)), np.full((1, 6), 9.0), STEP)
    assert laid[0] == loose and laid[0].layout is not None
    checked = check_rows([loose, laid[0]], np.full((2, 12), 5.0), NOW, STEP, 0.9)
    assert [idx for idx, _, _ in checked.groups] == [[1, 0]]
    lower = np.array([[0.0] * 3, [1.0] * 3])
    issued = issue_checked(checked, lower, lower + 1.0, STEP)
    for r, s in enumerate(issued):
        assert s.pending[-1].lower == (float(r),) * 3
        assert s.pending[-1].upper == (float(r) + 1.0,) * 3
