"""The overflow reserves of a tick taken together (issue 20): `overflow_reserve_chunk`
gives each row of a chunk of records that share their times (`floor_rows.remember_rows`'
chunks) exactly what the reserve of its records alone was (the same peak, age and count:
tests/floor_reference.py's `overflow_reserve`, the oracle), in chunks of rows or all at
once, and so does `overflow_reserve` (one row of the same steps); and the planner's
floors with the reserves taken together are the floors decided alone."""

from __future__ import annotations

import math

import numpy as np
import pytest
from floor_reference import overflow_reserve as old_overflow_reserve
from test_floor_batch import plans_are_each_floor_alone

from gpuscaler.core import reserve
from gpuscaler.core.model import FloatArray
from gpuscaler.core.reserve import Reserve, overflow_reserve, overflow_reserve_chunk

TICK = 30.0


def lanes(seed: int, width: int, n: int) -> tuple[list[FloatArray], float]:
    """`width` workloads' records on one schedule (a missed tick now and then): gamma
    demand with bursts, NaN and inf values, equal peaks (the newest is reported)."""
    rng = np.random.default_rng(seed)
    t = 1000.0 + TICK * np.cumsum(rng.integers(1, 3, n))
    out = []
    for j in range(width):
        v = rng.gamma(2 + j % 3, 60, n) * np.where(rng.random(n) < 0.06, 4.0, 1.0)
        v[rng.random(n) < 0.04] = np.nan
        v[rng.random(n) < 0.02] = np.inf
        v[rng.random(n) < 0.08] = 300.0
        if j == 1:
            v[:] = 50.0  # flat: never overflows
        rows = np.zeros((n, 4))
        rows[:, 0], rows[:, 1] = t, v
        out.append(rows)
    return out, float(t[-1]) if n else 1000.0


SIZES = [(50.0, 70.0), (80.0, 80.0), (200.0, 250.0), (12.5, 17.5)]


def sizes(width: int) -> tuple[list[float], list[float]]:
    return [SIZES[j % 4][0] for j in range(width)], [SIZES[j % 4][1] for j in range(width)]


def chunk(recs: list[FloatArray]) -> FloatArray:
    """Records on one schedule as the (rows, records, 4) array `remember_rows` keeps."""
    return np.stack(recs) if recs else np.zeros((0, 0, 4))


def alone(
    recs: list[FloatArray],
    now: float,
    window: float,
    span: float,
    at: list[float],
    full: list[float],
) -> list[Reserve | None]:
    """Each record array's reserve alone: the oracle's, which `overflow_reserve` (one
    row of the chunk's steps) must give too."""
    found = [
        old_overflow_reserve(tuple(map(tuple, r.tolist())), now, window, span, a, f)
        for r, a, f in zip(recs, at, full, strict=True)
    ]
    assert found == [
        overflow_reserve(r, now, window, span, a, f) for r, a, f in zip(recs, at, full, strict=True)
    ]
    return found


@pytest.mark.parametrize("chunk_rows", [1, 4, reserve.CHUNK_ROWS])
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(("window", "span"), [(300.0, 7200.0), (45.0, 900.0), (0.0, 600.0)])
def test_reserves_taken_together_are_each_workloads_reserve(
    monkeypatch: pytest.MonkeyPatch, chunk_rows: int, seed: int, window: float, span: float
) -> None:
    monkeypatch.setattr(reserve, "CHUNK_ROWS", chunk_rows)
    recs, now = lanes(seed, 10, 260)
    at, full = sizes(10)
    hits = 0
    for cut in (2, 40, 130, 260):  # the records as they grow
        part = [r[:cut] for r in recs]
        end = float(part[0][-1, 0])
        for when in (end, end + 400.0, now + 1e5):
            together = overflow_reserve_chunk(chunk(part), when, window, span, at, full)
            assert together == alone(part, when, window, span, at, full)
            hits += sum(r is not None for r in together)
    assert (hits > 0) == (window > 0)  # an empty window sizes nothing: no reserve


def test_chunks_on_other_schedules_or_too_short_each_give_the_reserves_alone() -> None:
    a, now_a = lanes(0, 4, 200)
    b, now_b = lanes(1, 3, 230)  # other record times: a chunk of its own
    now = max(now_a, now_b)
    for span in (7200.0, 600.0, 1.0):
        for part in (a, b):
            at, full = sizes(len(part))
            together = overflow_reserve_chunk(chunk(part), now, 300.0, span, at, full)
            assert together == alone(part, now, 300.0, span, at, full)
        for short in ([r[:1] for r in a], [r[:0] for r in b]):  # nothing to size from
            at, full = sizes(len(short))
            assert overflow_reserve_chunk(chunk(short), now, 300.0, span, at, full) == [None] * len(
                short
            )
            assert alone(short, now, 300.0, span, at, full) == [None] * len(short)


def test_the_newest_of_equal_highest_overflows_is_reported() -> None:
    t = 1000.0 + TICK * np.arange(12)
    rows = np.zeros((12, 4))
    rows[:, 0] = t
    rows[:, 1] = [10.0, 10.0, 500.0, 10.0, 10.0, 500.0, 10.0, 10.0, 200.0, 10.0, math.nan, 10.0]
    recs = [rows.copy() for _ in range(4)]
    now = float(t[-1])
    found = overflow_reserve_chunk(
        chunk(recs), now, 60.0, 3600.0, [10.0] * len(recs), [14.0] * len(recs)
    )
    assert found == [Reserve(500.0, now - float(t[5]), 3)] * len(recs)


def test_a_chunks_rows_are_taken_in_chunks_of_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    inner = reserve._reserve_rows

    def spy(t: FloatArray, v: FloatArray, *args: float | FloatArray) -> list[Reserve | None]:
        seen.append(len(v))
        return inner(t, v, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(reserve, "_reserve_rows", spy)
    recs, now = lanes(3, 6, 150)
    at, full = sizes(len(recs))
    for rows, calls in ((reserve.CHUNK_ROWS, [6]), (4, [4, 2]), (1, [1] * 6)):
        monkeypatch.setattr(reserve, "CHUNK_ROWS", rows)
        together = overflow_reserve_chunk(chunk(recs), now, 300.0, 7200.0, at, full)
        assert seen == calls
        seen.clear()
        assert together == alone(recs, now, 300.0, 7200.0, at, full)  # one row each
        assert seen == [1] * len(recs)
        seen.clear()


def test_a_plan_whose_reserves_are_taken_as_rows_is_each_floor_decided_alone() -> None:
    _, reasons = plans_are_each_floor_alone(12)
    assert any("reserve" in r for r in reasons)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("times", ["shuffled", "reversed", "a tie"])
def test_a_chunk_whose_records_are_out_of_time_order_gives_each_rows_reserve_alone(
    seed: int, times: str
) -> None:
    recs, now = lanes(seed, 6, 120)
    rng = np.random.default_rng(seed)
    order = {
        "shuffled": rng.permutation(120),
        "reversed": np.arange(120)[::-1],
        "a tie": np.r_[np.arange(60), 59, np.arange(61, 120)],  # one time twice, in order
    }[times]
    part = [r[order] for r in recs]
    at, full = sizes(len(part))
    hits = 0
    for window, span in ((300.0, 7200.0), (45.0, 900.0), (120.0, 1800.0)):
        together = overflow_reserve_chunk(chunk(part), now, window, span, at, full)
        assert together == alone(part, now, window, span, at, full)
        hits += sum(r is not None for r in together)
    assert hits > 0
