"""Issue 20 (fr7): the kept scorings are refreshed as (row, origin) pairs, all rows and
origins at once, whatever phase each row's origins are on; the smoothing levels of all
those origins come from one pass of the tape. The oracle is the refresh before
(tests/scored_reference.py: one pass a group of rows that share `newest` and an origin),
compared bit for bit on generated windows."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import scored_reference as old
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuscaler.core.forecast.engines import LeastSquaresArima
from gpuscaler.core.forecast.ensemble import arima_at, arima_in_window, assess
from gpuscaler.core.forecast.scored import refresh, score
from gpuscaler.core.forecast.tape import SesTape, ses_last
from gpuscaler.core.model import FloatArray, Scored

STEP = 10.0
NOW = 1_700_000_000.0
SETTINGS = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


def _window(seed: int, n: int, t: int, gaps: float, flat: bool) -> FloatArray:
    """n wandering rows with bursts and NaN gaps; `flat`: the last row all 0.0."""
    rng = np.random.default_rng(seed)
    walk = 50 + np.cumsum(rng.normal(0, 1.0, (n, t)), axis=1)
    hist = walk + (rng.random((n, t)) < 0.03) * rng.uniform(5, 20, (n, 1))
    hist[rng.random((n, t)) < gaps] = np.nan
    if flat:
        hist[-1] = 0.0
    return hist


def _bits(s: Scored) -> tuple[object, ...]:
    """Every field of a scoring, arrays and floats by their bytes (NaN equal to NaN)."""
    return (
        s.method,
        np.array(s.weights).tobytes(),
        tuple((k, np.float64(v).tobytes()) for k, v in s.errors.items()),
        s.ses_best,
        *(np.ascontiguousarray(a).tobytes() for a in (s.ses_inv, s.abs_errors)),
        *(np.ascontiguousarray(a).tobytes() for a in (s.abs_recent, s.peak_recent)),
        *(a.shape for a in (s.abs_errors, s.abs_recent, s.peak_recent)),
        np.float64(s.peak).tobytes(),
        s.newest,
    )


@st.composite
def cases(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 7))
    return {
        "seed": draw(st.integers(0, 10_000)),
        "n": n,
        "t": draw(st.integers(100, 230)),
        "steps": draw(st.sampled_from([6, 15, 30, 45])),
        "gaps": draw(st.sampled_from([0.0, 0.0, 0.02, 0.2])),
        "flat": draw(st.booleans()),
        "d": draw(st.sampled_from([0, 1])),
        # each row's scoring `behind` buckets older than the newest complete origin (rows
        # refitted at other ticks: other phases of the spacing; far behind: origins
        # before the first one the window can score)
        "behind": draw(st.lists(st.integers(0, 12) | st.integers(0, 260), min_size=n, max_size=n)),
        # each row's kept origins cut to its last `keep` (a row that holds fewer)
        "keep": draw(st.lists(st.none() | st.integers(1, 80), min_size=n, max_size=n)),
        "usable": draw(st.lists(st.booleans(), min_size=n, max_size=n)),
        "extra": draw(st.integers(0, 3)),
    }


def _refreshed_both(case: dict[str, Any]) -> tuple[list[Scored], list[Scored]]:
    """The new and the old refresh of the same kept scorings, each with its own tape of a
    batch that has `extra` rows more than the refreshed ones."""
    n, t, steps, extra = (int(case[k]) for k in ("n", "t", "steps", "extra"))
    big = _window(case["seed"], n + extra, t, case["gaps"], case["flat"])
    rows = np.arange(extra, n + extra)
    hist = big[rows]
    engine = LeastSquaresArima(3, case["d"])
    fitted = engine.fit(hist)
    usable = np.array(case["usable"], dtype=bool)
    a = assess(engine, fitted, hist, steps, engine.predict_mean(fitted, hist, steps), usable)
    if a is None:
        return [], []
    first = NOW - steps * STEP
    made = score(a, first)
    kept: list[Scored] = []
    for r, s in enumerate(made):
        behind, keep = case["behind"][r], case["keep"][r]
        cut = slice(None) if keep is None else slice(-keep, None)
        kept.append(
            replace(
                s,
                newest=first - behind * STEP,
                abs_recent=s.abs_recent[cut],
                peak_recent=s.peak_recent[cut],
            )
        )
    new = refresh(engine, fitted, hist, kept, usable, NOW, STEP, SesTape(big).rows(rows))
    was = old.refresh(engine, fitted, hist, kept, usable, NOW, STEP, SesTape(big).rows(rows))
    alone = refresh(engine, fitted, hist, kept, usable, NOW, STEP)
    assert [_bits(s) for s in alone] == [_bits(s) for s in new]
    return new, was


@SETTINGS
@given(cases())
def test_refreshed_scorings_equal_the_old_refresh_bit_for_bit(case: dict[str, Any]) -> None:
    new, was = _refreshed_both(case)
    assert len(new) == len(was)
    for got, want in zip(new, was, strict=True):
        assert _bits(got) == _bits(want)


def test_rows_on_other_phases_and_rows_that_hold_fewer_are_refreshed_as_before() -> None:
    """A table of the shapes a batch meets (30 steps: origins 2 buckets apart, a row
    `behind` b buckets has b // 2 new ones): one phase; two phases, one new origin each;
    two phases, 2 and 1 new origins (the steady lanes); a row far behind; full rows with
    a short one; rows that hold fewer; no new origin."""
    table: list[dict[str, Any]] = [
        {"behind": [2, 2, 2], "keep": [None, None, None]},
        {"behind": [2, 3, 2], "keep": [None, None, None]},
        {"behind": [4, 3, 2], "keep": [None, None, None]},
        {"behind": [4, 250, 3], "keep": [None, None, None]},
        {"behind": [3, 4, 3], "keep": [None, 5, None]},
        {"behind": [3, 4, 2], "keep": [70, 71, 72]},
        {"behind": [0, 1, 0], "keep": [None, None, None]},
    ]
    changed = 0
    for row in table:
        case: dict[str, Any] = {
            "seed": 7,
            "n": 3,
            "t": 220,
            "steps": 30,
            "gaps": 0.02,
            "flat": False,
        }
        case |= {"d": 1, "usable": [True, False, True], "extra": 2} | row
        new, was = _refreshed_both(case)
        assert new and [_bits(s) for s in new] == [_bits(s) for s in was]
        changed += sum(
            s.newest != NOW - 30 * STEP - b * STEP for s, b in zip(new, row["behind"], strict=True)
        )
    assert changed > 0  # the table did roll errors on


@SETTINGS
@given(
    st.integers(0, 10_000),
    st.integers(1, 6),
    st.integers(2, 90),
    st.lists(st.integers(0, 89), min_size=1, max_size=8),
)
def test_the_tapes_levels_at_many_ends_are_each_ends_own_levels(
    seed: int, n: int, t: int, ends: list[int]
) -> None:
    """In any order, repeated, and after the tape went past them: `ses_last` of the window
    up to each end, bit for bit (a row without a finite point yet: NaN)."""
    hist = _window(seed, n, t, 0.3, seed % 2 == 0)
    hist[0, : t // 2] = np.nan
    at = np.array([e % t for e in ends])
    tape = SesTape(hist)
    tape.at(t - 1)
    for got_all in (tape.many(at), SesTape(hist).many(at)):
        for got, end in zip(got_all, at.tolist(), strict=True):
            assert got.tobytes() == ses_last(hist[:, : end + 1]).tobytes()
    rows = np.array([n - 1, 0])
    assert tape.rows(rows).many(at).tobytes() == tape.many(at)[:, :, rows].tobytes()


@SETTINGS
@given(st.integers(0, 10_000), st.integers(1, 5), st.sampled_from([0, 1]), st.integers(1, 12))
def test_arima_rolled_from_pairs_equals_every_rows_origins_rolled_together(
    seed: int, n: int, d: int, pairs: int
) -> None:
    """`arima_at` of (row, origin) pairs in any order equals the old `arima_in_window`'s
    paths of those rows and origins, and so does the new `arima_in_window`."""
    hist = _window(seed, n, 120, 0.05, False)
    engine = LeastSquaresArima(4, d)
    fitted = engine.fit(hist)
    origins = np.arange(10, 100, 7)
    whole = old.arima_in_window(engine, fitted, hist, origins, 9)
    assert arima_in_window(engine, fitted, hist, origins, 9).tobytes() == whole.tobytes()
    rng = np.random.default_rng(seed)
    rows, at = rng.integers(0, n, pairs), rng.integers(0, origins.size, pairs)
    got = arima_at(engine, fitted, hist, rows, origins[at], 9)
    assert got.tobytes() == whole[rows, at].tobytes()
