"""The planner's per-workload steps read from the rows it already has (issue 20): the
reserves and observed peaks read from the chunks of remembered records (against
`overflow_reserve` and `observed_peak` of each alone), and the stabilization window
(against the tuple-of-generator version it replaces), and a time slice's history kept as
it is when nothing in it changes. (The window maxima: tests/test_window_max.py.)"""

from __future__ import annotations

import math
import struct
from dataclasses import replace

import numpy as np
import pytest
from test_floor_rows import histories
from test_reserve_batch import alone, lanes, sizes

from gpuscaler.config import ReplicasConfig
from gpuscaler.core import reserve
from gpuscaler.core.floor_rows import chunk_peaks, remember_rows
from gpuscaler.core.model import FloatArray, TargetHistory
from gpuscaler.core.replicas import _stabilized, observed_peak
from gpuscaler.core.reserve import overflow_reserve_chunk
from gpuscaler.core.skill import floor_history
from gpuscaler.core.time_slice import _calm_since

NOW = 1_700_000_000.0


@pytest.mark.parametrize("chunk", [reserve.CHUNK_ROWS, 3, 1])
@pytest.mark.parametrize("seed", range(3))
def test_reserves_read_from_a_chunk_of_records_are_each_workloads_reserve(
    monkeypatch: pytest.MonkeyPatch, chunk: int, seed: int
) -> None:
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
