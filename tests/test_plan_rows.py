"""The planner's per-workload steps read from the rows it already has (issue 20): the
window maxima of the overflow reserve from a sparse table (against `skill.window_max_rows`,
the `reduceat` it replaces), the reserves and observed peaks read from the chunks of
remembered records (against `overflow_reserve` and `observed_peak` of each alone), and
the stabilization window (against the tuple-of-generator version it replaces), and a
time slice's history kept as it is when nothing in it changes."""

from __future__ import annotations

import math
import struct
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_floor_rows import histories
from test_reserve_batch import alone, lanes, sizes

from gpuscaler.config import ReplicasConfig
from gpuscaler.core import reserve
from gpuscaler.core.floor_rows import chunk_peaks, remember_rows
from gpuscaler.core.model import FloatArray, IntArray, TargetHistory
from gpuscaler.core.replicas import _stabilized, observed_peak
from gpuscaler.core.reserve import overflow_reserve_chunk, window_max_table
from gpuscaler.core.skill import floor_history, window_max_rows
from gpuscaler.core.time_slice import _calm_since

NOW = 1_700_000_000.0


def same_maxima(got: FloatArray, want: FloatArray) -> bool:
    """Equal values (a zero's sign aside: the reserve cannot tell them apart), and the
    same bits wherever the value is not a zero."""
    if got.shape != want.shape or not np.array_equal(got, want):
        return False
    nonzero = want != 0.0
    return bool(got[nonzero].tobytes() == want[nonzero].tobytes())


def windows(n: int, pairs: list[tuple[int, int]]) -> tuple[IntArray, IntArray]:
    start = np.asarray([a for a, _ in pairs], dtype=np.intp)
    stop = np.asarray([b for _, b in pairs], dtype=np.intp)
    assert ((start >= 0) & (start <= stop) & (stop <= n)).all()
    return start, stop


@pytest.mark.parametrize(
    ("n", "pairs"),
    [
        (1, [(0, 1), (0, 0), (1, 1)]),  # one value; empty windows
        (8, [(0, 8), (0, 4), (4, 8), (3, 4), (2, 2)]),  # powers of two, the whole row
        (9, [(0, 9), (1, 8), (0, 3), (5, 8), (8, 9)]),  # odd widths, the last value
        (40, [(i, min(40, i + 10)) for i in range(40)]),  # the reserve's sliding windows
        (33, [(0, 33), (0, 17), (16, 33), (31, 33)]),  # a level past the half of the row
        (6, [(0, 0)] * 4),  # nothing to take: -inf everywhere
        (5, []),  # no windows
    ],
)
def test_window_maxima_from_the_table_are_the_reduceat_ones(
    n: int, pairs: list[tuple[int, int]]
) -> None:
    rng = np.random.default_rng(n)
    values = rng.choice([-np.inf, -0.0, 0.0, 3.0, 7.5, -2.0, 1e308], size=(4, n))
    values[1] = rng.normal(size=n)
    values[2] = -np.inf  # no finite value: every window -inf
    start, stop = windows(n, pairs)
    assert same_maxima(window_max_table(values, start, stop), window_max_rows(values, start, stop))


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 5),
    n=st.integers(1, 70),
    cuts=st.lists(st.tuples(st.integers(0, 70), st.integers(0, 70)), max_size=30),
    seed=st.integers(0, 2**32 - 1),
)
def test_window_maxima_from_the_table_are_the_reduceat_ones_on_generated_rows(
    rows: int, n: int, cuts: list[tuple[int, int]], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    values = rng.choice([-np.inf, -0.0, 0.0, 1.0, 2.0], size=(rows, n)) + np.where(
        rng.random((rows, n)) < 0.5, rng.normal(size=(rows, n)), 0.0
    )
    pairs = [(min(a, b) % (n + 1), min(max(a, b), n)) for a, b in cuts]
    pairs = [(a, max(a, b)) for a, b in pairs]
    start, stop = windows(n, pairs)
    assert same_maxima(window_max_table(values, start, stop), window_max_rows(values, start, stop))


@pytest.mark.parametrize("rows_from", [1, reserve.MIN_ROWS, 100])
@pytest.mark.parametrize("chunk", [reserve.CHUNK_ROWS, 3])
@pytest.mark.parametrize("seed", range(3))
def test_reserves_read_from_a_chunk_of_records_are_each_workloads_reserve(
    monkeypatch: pytest.MonkeyPatch, rows_from: int, chunk: int, seed: int
) -> None:
    monkeypatch.setattr(reserve, "MIN_ROWS", rows_from)
    monkeypatch.setattr(reserve, "CHUNK_ROWS", chunk)
    recs, now = lanes(seed, 11, 250)
    at, full = sizes(11)
    hits = 0
    for cut in (0, 1, 2, 60, 250):
        part = [r[:cut] for r in recs]
        stacked = np.stack(part)[:, :, :]  # (rows, records, 4) as remember_rows keeps them
        for window, span in ((300.0, 7200.0), (45.0, 900.0), (0.0, 600.0)):
            together = overflow_reserve_chunk(stacked, now, window, span, at, full)
            assert together == alone(part, now, window, span, at, full)
            hits += sum(r is not None for r in together)
    assert hits > 0


def remembered(ticks: int) -> tuple[list[TargetHistory], list[tuple[list[int], FloatArray]], float]:
    hs = histories(ticks, 23, ticks)
    now = NOW + 30.0 * ticks
    recs = [(now, float(i % 4) - 1.0, i + 0.5, i - 0.5) for i in range(len(hs))]
    keeps = [(600.0, 90.0, 1e9)[i % 3] for i in range(len(hs))]
    got, chunks = remember_rows(hs, now, recs, keeps)
    return got, chunks, now


def bits(v: float) -> bytes:
    return struct.pack("<d", v)


@pytest.mark.parametrize("ticks", [1, 5, 40])
def test_every_remembered_history_is_one_row_of_one_chunk(ticks: int) -> None:
    got, chunks, _ = remembered(ticks)
    places = sorted(i for idx, _ in chunks for i in idx)
    assert places == list(range(len(got)))
    for idx, recs in chunks:
        assert not recs.flags.writeable
        for j, i in enumerate(idx):
            rows = got[i].seen_rows
            assert rows is not None and np.shares_memory(rows, recs)
            assert rows.tobytes() == recs[j].tobytes()
            assert len(got[i].seen) == recs.shape[1]
    assert len(chunks) > 1  # histories on other schedules: chunks of their own


@pytest.mark.parametrize("ticks", [1, 5, 40])
def test_observed_peaks_read_from_the_chunks_are_each_historys_own(ticks: int) -> None:
    got, chunks, now = remembered(ticks)
    windows = [(0.0, 30.0, 95.0, 1e9, 60.0)[i % 5] for i in range(len(got))]
    peaks = chunk_peaks(chunks, now, windows)
    for h, w, peak in zip(got, windows, peaks, strict=True):
        assert bits(peak) == bits(observed_peak(h, now, w))
    assert len({bits(p) for p in peaks}) > 2


def old_stabilized(
    h: TargetHistory,
    cfg: ReplicasConfig,
    now: float,
    sized: float,
    capacity: float,
    current: int,
    ceiling: int,
    recommended: int,
) -> tuple[TargetHistory, int]:
    """replicas._stabilized before issue 20's rows (the oracle)."""
    window_start = now - cfg.scale_down_stabilization
    recs = (*tuple(r for r in h.recommendations if r[0] > window_start), (now, math.ceil(sized)))
    h = floor_history(h, recommendations=recs)
    held_for = max(v for _, v in recs)
    held = max(cfg.min_replicas, min(ceiling, math.ceil(held_for / capacity - 1e-9)))
    stabilized = max(recommended, min(current, held)) if recommended < current else recommended
    margin = cfg.scale_down_margin
    if stabilized < current and margin > 0:
        kept = min(current, math.ceil(held_for / (capacity * (1 - margin)) - 1e-9))
        stabilized = max(stabilized, min(ceiling, kept))
    return h, stabilized


RECOMMENDATIONS = [
    (),
    ((NOW - 400.0, 900),),  # out of the window
    ((NOW - 290.0, 120), (NOW - 30.0, 80)),
    ((NOW - 30.0, 80), (NOW - 290.0, 120), (NOW - 300.0, 999)),  # out of time order
    ((NOW - 60.0, 50), (NOW - 30.0, 50), (NOW, 50)),  # ties, one at now
]


@pytest.mark.parametrize("recs", RECOMMENDATIONS)
@pytest.mark.parametrize("sized", [0.0, 49.5, 120.0, 1e6])
@pytest.mark.parametrize(("current", "recommended"), [(3, 1), (3, 3), (1, 4), (10, 2)])
@pytest.mark.parametrize("margin", [0.0, 0.2])
def test_the_stabilization_window_is_the_one_it_replaces(
    recs: tuple[tuple[float, int], ...], sized: float, current: int, recommended: int, margin: float
) -> None:
    cfg = ReplicasConfig(scale_down_stabilization="5m", scale_down_margin=margin)
    h = TargetHistory(recommendations=recs, fallback=True, last_change_at=NOW - 10.0)
    args = (cfg, NOW, sized, 40.0, current, 12, recommended)
    assert _stabilized(h, *args) == old_stabilized(h, *args)


@pytest.mark.parametrize("calm_since", [None, NOW - 60.0])
@pytest.mark.parametrize("to", [None, NOW - 60.0, NOW])
def test_a_time_slice_history_is_kept_as_it_is_only_when_its_calm_time_is_the_same(
    calm_since: float | None, to: float | None
) -> None:
    h = TargetHistory(calm_since=calm_since, last_change_at=NOW - 5.0, pending_direction=1)
    value = h.calm_since if to == calm_since else to  # the very value, as decide_time_slice
    got = _calm_since(h, value)
    assert got == replace(h, calm_since=value)
    assert (got is h) == (to == calm_since)
