"""What the forecast makes for every series at every tick but seldom reads is made when
read (issue 20): a forecast's reason, an interval state's pending intervals. Readers see
what the constructor would have been given; the batched interval check, which groups
states by the identity of their shared layout first, gives what each state alone gives."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace
from typing import Any, cast

import forecast_reference as old
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scored_reference import _reason as _reason_before
from test_interval_resolve import reference as resolve_one

from gpuscaler.core.forecast import made
from gpuscaler.core.forecast.assembly import _scored_reason, _weights_template
from gpuscaler.core.forecast.ensemble import MEMBERS, SES_ALPHAS
from gpuscaler.core.forecast.intervals import (
    coverage_note,
    coverage_text,
    issue_rows,
    reissue,
    resolve_rows,
)
from gpuscaler.core.model import FloatArray, Forecast, IntervalState, IssuedInterval, pending_of

STEP = 10.0
NOW = 10_000.0


def _bounds(*rows: list[float]) -> FloatArray:
    out = np.array(rows, dtype=np.float64)
    out.flags.writeable = False
    return out


LAYOUT = ((9_970.0, STEP, 3), (9_980.0, STEP, 2), (9_990.0, STEP, 0))
BOUNDS = _bounds([1.0, 2.0, 3.0, -0.0, 5.5], [4.0, 5.0, 6.0, 0.0, 7.25])
EAGER = (
    IssuedInterval(9_970.0, STEP, (1.0, 2.0, 3.0), (4.0, 5.0, 6.0)),
    IssuedInterval(9_980.0, STEP, (-0.0, 5.5), (0.0, 7.25)),
    IssuedInterval(9_990.0, STEP, (), ()),
)


def test_pending_intervals_left_to_the_reader_are_the_ones_the_bounds_were_issued_with() -> None:
    lazy = made.interval_state(0.9, NOW, None, 12, 3, LAYOUT, BOUNDS)
    want = IntervalState(0.9, NOW, EAGER, 12, 3)
    assert "pending" not in vars(lazy)
    assert lazy == want and hash(lazy) == hash(want)  # read through the field
    assert lazy.pending == EAGER
    assert [math.copysign(1.0, v) for v in lazy.pending[1].lower] == [-1.0, 1.0]
    assert "pending" in vars(lazy) and "_lazy_pending" not in vars(lazy)
    assert lazy.pending is lazy.pending  # made once
    assert repr(lazy) == repr(want)
    assert dataclasses.replace(lazy, level=0.5) == dataclasses.replace(want, level=0.5)
    assert pending_of((), _bounds([], [])) == ()


def test_a_reason_left_to_the_reader_is_made_once_with_the_text_it_was_given() -> None:
    calls: list[int] = []

    def make(a: str, b: int) -> str:
        calls.append(b)
        return f"{a} {b}"

    row = np.arange(3.0)
    row.flags.writeable = False
    args = (NOW, STEP, row, row, row, 0.9, "ensemble")
    lazy = made.forecast(*args, (make, ("why", 7)), 1.0, {}, 0.0, True)
    eager = Forecast(*args, "why 7", 1.0, {}, 0.0)
    assert not calls
    assert repr(lazy) == repr(eager) and calls == [7]
    assert lazy.reason == "why 7" and calls == [7]
    again = made.forecast(*args, (make, ("why", 8)), 1.0, {}, 0.0)
    assert dataclasses.replace(again, level=0.5).reason == "why 8"
    assert again.is_finite()  # not given: checked from the arrays


def test_a_lazy_field_with_neither_its_value_nor_its_maker_is_missing() -> None:
    broken = made.interval_state(0.9, NOW, None, 0, 0, LAYOUT, BOUNDS)
    del vars(broken)["_lazy_pending"]
    with pytest.raises(AttributeError, match="pending"):
        _ = broken.pending


def _coverage_before(state: IntervalState | None, nominal: float) -> str:
    """`coverage_note` as it was at ed31a8e (the oracle)."""
    if state is None or not state.points:
        return f"interval level {nominal:g}"
    seen = 1 - state.misses / state.points
    level = state.level
    return (
        f"interval at conformal level {level:.2f} (nominal {nominal:g}, "
        f"{seen:.2f} covered of {state.points} points so far)"
        if math.isfinite(level)
        else f"interval level {nominal:g}"
    )


@pytest.mark.parametrize(
    ("state", "nominal"),
    [
        (None, 0.9),
        (IntervalState(0.9, NOW), 0.95),
        (IntervalState(0.874999, NOW, (), 40, 5), 0.9),
        (IntervalState(math.nan, NOW, (), 40, 5), 0.9),
        (IntervalState(math.inf, NOW, (), 3, 0), 0.8),
        (IntervalState(0.995, NOW, (), 7, 7), 0.85),
    ],
)
def test_the_coverage_note_reads_as_before_from_the_state_or_its_figures(
    state: IntervalState | None, nominal: float
) -> None:
    want = _coverage_before(state, nominal)
    assert coverage_note(state, nominal) == want
    if state is not None:
        assert coverage_text(nominal, state.level, state.points, state.misses) == want


def test_a_scored_reason_made_later_reads_as_the_one_made_at_once() -> None:
    """Against the reason as it was written row by row (tests/scored_reference.py)."""
    errors = {"ensemble": 1.234, "arima": 2.0, "last_value": 3.456, "window_mean": 0.5}
    name, shares = "arima(5,1,0)", [0.125, 0.333, 0.5, 0.041]
    template = _weights_template(name)
    weights = dict(zip(MEMBERS, shares, strict=True))
    for method, dropped in (("ensemble", None), ("last_value", "arima dropped: no fit")):
        for nominal, level, points, misses in ((0.9, 0.87, 40, 5), (0.8, 0.8, 0, 0)):
            got = _scored_reason(
                name, template, shares, 2, dropped, method, errors, nominal, level, points, misses
            )
            batch = cast(Any, SimpleNamespace(engine=SimpleNamespace(name=name)))
            model = cast(Any, SimpleNamespace(dropped=[dropped]))
            alpha = SES_ALPHAS[2]
            state = IntervalState(level, NOW, (), points, misses)
            want = _reason_before(batch, model, weights, alpha, 0, method, errors)
            assert got == want + "; " + _coverage_before(state, nominal)


def _interval(rng: np.random.Generator, origin: float) -> IssuedInterval:
    size = int(rng.integers(1, 6))
    lower = rng.normal(50, 10, size)
    upper = lower + rng.uniform(0, 20, size)
    return IssuedInterval(origin, STEP, tuple(lower.tolist()), tuple(upper.tolist()))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rows=st.integers(1, 12), ticks=st.integers(1, 6))
def test_states_checked_and_issued_in_batches_follow_each_state_alone(
    seed: int, rows: int, ticks: int
) -> None:
    """Over several ticks: a batch's states share one layout object; some are replaced by
    states with only tuples (`reissue`, hand-made), by copies with an equal layout in
    another object, by ones with the batch's layout checked at another time, or start
    afresh. Each row's state equals the one-by-one check and issue (the oracle)."""
    rng = np.random.default_rng(seed)
    steps = int(rng.integers(1, 5))
    batch: list[IntervalState | None] = [None] * rows
    alone: list[IntervalState | None] = [None] * rows
    now = NOW
    for _ in range(ticks):
        hist = rng.normal(50, 15, (rows, 12))
        hist[rng.random(hist.shape) < 0.1] = np.nan
        checked = resolve_rows(batch, hist, now, STEP, 0.9)
        alone_checked = [resolve_one(s, hist[r], now, STEP, 0.9) for r, s in enumerate(alone)]
        assert checked == alone_checked
        lower = rng.normal(50, 10, (rows, steps))
        upper = lower + rng.uniform(0, 10, (rows, steps))
        batch = list(issue_rows(checked, lower, upper, STEP))
        alone = [old.issue(s, lower[r], upper[r], STEP) for r, s in enumerate(alone_checked)]
        assert batch == alone
        come_back(rng, batch, alone, lower, upper, now)
        now += 30.0


def come_back(
    rng: np.random.Generator,
    batch: list[IntervalState | None],
    alone: list[IntervalState | None],
    lower: FloatArray,
    upper: FloatArray,
    now: float,
) -> None:
    """Replace some of the states issued (`batch`, and the oracle's `alone`) by the ways a
    state comes back other than from the batch: reissued, tuple-only, with an interval
    added by hand, fresh, an equal layout in another object, the batch's layout checked
    at another time."""
    rows = len(batch)
    for r in range(rows):
        s = batch[r]
        assert s is not None
        way = rng.integers(0, 7)
        if way == 0:
            batch[r] = alone[r] = reissue(s, lower[r] + 1.0, upper[r] + 1.0)
        elif way == 1:
            batch[r] = alone[r] = IntervalState(
                s.level, s.checked_at, s.pending, s.points, s.misses
            )
        elif way == 2 and s.pending:
            extra = (*s.pending, _interval(rng, now - STEP))
            batch[r] = alone[r] = IntervalState(s.level, now, extra, s.points, s.misses)
        elif way == 3:
            batch[r] = alone[r] = None
        elif way == 4 and s.layout is not None and s.bounds is not None:
            layout = tuple(list(s.layout))  # equal to the batch's, another object
            bounds = s.bounds.copy()
            batch[r] = made.interval_state(
                s.level, s.checked_at, None, s.points, s.misses, layout, bounds
            )
        elif way == 5:  # the batch's layout object, checked at another time
            batch[r] = alone[r] = dataclasses.replace(s, checked_at=s.checked_at - STEP)
