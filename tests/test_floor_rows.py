"""The replica floor's per-workload numbers taken over rows of all workloads
(gpuscaler.core.floor_rows) are each workload's own to the last bit: the forecast's
figures against what the floor took of it alone (tests/floor_reference.py), the records
against `skill.remember`, the observed peaks against `replicas.observed_peak`; and a plan
of many workloads, in chunks, is each floor decided alone."""

from __future__ import annotations

import math
import struct
from dataclasses import replace

import numpy as np
import pytest
from builders import NOW, forecast
from floor_reference import forecast_figures as alone_figures
from floor_reference import observed_peak as old_observed_peak
from test_floor_batch import plans_are_each_floor_alone

from gpuscaler.core import floor_rows, pairwise, skill
from gpuscaler.core.floor_rows import (
    chunk_peaks,
    forecast_figures,
    pool_figures,
    remember_many,
    remember_rows,
)
from gpuscaler.core.model import Forecast, TargetHistory
from gpuscaler.core.replicas import observed_peak
from gpuscaler.core.skill import remember


@pytest.fixture(params=[floor_rows.CHUNK_ROWS, 3, 5])
def chunk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Rows a chunk: the default, and small ones (chunks that split the groups)."""
    rows: int = request.param
    monkeypatch.setattr(floor_rows, "CHUNK_ROWS", rows)
    return rows


def bits(values: tuple[object, ...]) -> tuple[object, ...]:
    """Floats by their bits (the sign of a zero, NaN alike), the rest as they are."""
    return tuple(struct.pack("<d", v) if isinstance(v, float) else v for v in values)


def forecasts(seed: int, n: int) -> list[Forecast]:
    """Forecasts of a few lengths and steps: finite, a NaN or an inf somewhere, zeros of
    both signs, ties, a peak error."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        steps = (30, 12, 1)[i % 3]
        f = forecast(100.0)
        mean = (
            rng.choice([-0.0, 0.0, 5.0, 7.5, -3.0], steps) if i % 5 == 0 else rng.normal(size=steps)
        )
        upper = np.abs(mean) + rng.uniform(0, 2, steps)
        if i % 7 == 3:
            upper[rng.integers(steps)] = (math.nan, math.inf)[i % 2]
        if i % 11 == 4:
            upper = np.where(upper > 0, -0.0, upper)  # a zero (of either sign) is the max
        out.append(
            replace(
                f,
                step=(10.0, 30.0)[i % 2],
                mean=mean,
                lower=mean - 1.0,
                upper=upper,
                peak_error=float(rng.uniform(0, 3)) * (i % 2),
            )
        )
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_forecast_figures_over_rows_are_each_forecasts_own_to_the_last_bit(
    seed: int, chunk: int
) -> None:
    fs = forecasts(seed, 120)
    leads = [(60.0, 300.0, 0.0, 1e6)[i % 4] for i in range(len(fs))]
    got = forecast_figures([*fs, None], [*leads, 60.0])
    assert got[-1] is None  # no forecast: no figures
    taken = 0
    for f, lead, figs in zip(fs, leads, got, strict=False):
        want = alone_figures(f, lead)
        if figs is None:
            continue  # left to the floor alone (a zero, a small group)
        taken += 1
        if not figs[0]:
            assert not want[0]
        else:
            assert bits(figs) == bits(want)
    assert taken > len(fs) // 2


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_pool_figures_over_rows_are_each_forecasts_own_peak_and_upper_to_the_last_bit(
    seed: int, chunk: int
) -> None:
    fs = forecasts(seed, 120)
    got = pool_figures([*fs, None])
    assert got[-1] is None  # no forecast: no figures
    taken = 0
    for f, figs in zip(fs, got, strict=False):
        if figs is None:
            continue  # left to the fragments alone (a zero, a small group)
        taken += 1
        assert figs[0] == f.is_finite()
        if figs[0]:
            assert bits((figs[1], figs[3])) == bits((f.peak_upper, f.peak))
    assert taken > len(fs) // 2


def test_small_groups_and_empty_paths_are_left_to_each_floor_alone() -> None:
    fs = forecasts(7, floor_rows.MIN_ROWS - 1)
    assert forecast_figures(fs, [60.0] * len(fs)) == [None] * len(fs)
    empty = replace(forecast(1.0), mean=np.zeros(0), lower=np.zeros(0), upper=np.zeros(0))
    assert forecast_figures([empty] * 8, [60.0] * 8) == [None] * 8


def test_a_zero_as_the_highest_value_is_left_to_each_floor_alone() -> None:
    f = forecast(0.0, 0.0)
    got = forecast_figures([f] * 8, [60.0] * 8)
    assert got == [None] * 8
    assert forecast_figures([forecast(3.0)] * 8, [60.0] * 8)[0] == (True, 8.0, 3.0, 3.0)


def histories(seed: int, n: int, ticks: int) -> list[TargetHistory]:
    """n histories remembered one at a time over `ticks` ticks: most on one schedule,
    some starting late, one whose records came out of time order, NaN and tied values."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        h = TargetHistory()
        for k in range(ticks if i % 6 else ticks // 2):
            now = NOW + 30.0 * k
            value = (
                float(rng.choice([math.nan, 0.0, -0.0, 5.0]))
                if i % 9 == 1
                else float(rng.uniform(0, 9))
            )
            h = remember(h, now, value, value + 1.0, value, 600.0)
        if i == 3:
            h = remember(h, NOW - 5000.0, 1.0, 2.0, 1.0, 1e9)  # out of order, dropped next
        out.append(h)
    return out


@pytest.mark.parametrize("ticks", [0, 1, 5, 40])
def test_records_remembered_together_are_each_historys_own(ticks: int, chunk: int) -> None:
    hs = histories(ticks, 20, ticks)
    now = NOW + 30.0 * ticks
    recs = [(now, float(i), i + 0.5, i - 0.5) for i in range(len(hs))]
    keeps = [(600.0, 90.0, 1e9)[i % 3] for i in range(len(hs))]
    got = remember_many(hs, now, recs, keeps)
    for h, rec, keep, new in zip(hs, recs, keeps, got, strict=True):
        want = remember(h, now, *rec[1:], keep)
        assert new == want
        assert want.seen_rows is not None and new.seen_rows is not None
        assert new.seen_rows.tobytes() == want.seen_rows.tobytes()
        assert new.seen_rows.shape == want.seen_rows.shape
        assert not new.seen_rows.flags.writeable
    assert any(len(h.seen) < len(n.seen) for h, n in zip(hs, got, strict=True))
    if ticks == 40:
        assert any(len(n.seen) <= len(h.seen) for h, n in zip(hs, got, strict=True))  # dropped


@pytest.mark.parametrize("ticks", [1, 5, 40])
def test_histories_of_one_length_on_other_schedules_are_remembered_in_chunks_of_their_own(
    ticks: int, chunk: int
) -> None:
    hs = []
    for i in range(12):  # a third 10 s later, one with a tick missed and one added
        h = TargetHistory()
        times = [NOW + 30.0 * k + (10.0 if i % 3 == 1 else 0.0) for k in range(ticks)]
        if i == 5 and ticks > 2:
            times = [*times[:1], *times[2:], times[-1] + 15.0]
        for k, when in enumerate(times):
            h = remember(h, when, float(i + k), 1.0, 1.0, 1e9)
        hs.append(h)
    now = NOW + 30.0 * ticks
    recs = [(now, float(i), i + 0.5, i - 0.5) for i in range(len(hs))]
    got, chunks = remember_rows(hs, now, recs, [1e9] * len(hs))
    for h, rec, new in zip(hs, recs, got, strict=True):
        want = remember(h, now, *rec[1:], 1e9)
        assert new == want
        assert new.seen_rows is not None and want.seen_rows is not None
        assert new.seen_rows.tobytes() == want.seen_rows.tobytes()
    for idx, rows in chunks:  # a chunk's histories share their record times
        assert all(rows[j, :, 0].tobytes() == rows[0, :, 0].tobytes() for j in range(len(idx)))
    assert len({i for idx, _ in chunks for i in idx}) == len(hs)
    assert len(chunks) >= (3 if ticks > 2 else 2)


@pytest.mark.parametrize("window", [0.0, 30.0, 95.0, 1e9])
def test_observed_peaks_taken_together_are_each_historys_own(window: float, chunk: int) -> None:
    now = NOW + 30.0 * 12
    # As the plan reads them: each with this tick's record.
    old = histories(11, 30, 12)
    recs = [(now, float(i % 3), 1.0, 1.0) for i in range(len(old))]
    hs, chunks = remember_rows(old, now, recs, [600.0] * len(old))
    windows = [window if i % 4 else 60.0 for i in range(len(hs))]
    got = chunk_peaks(chunks, now, windows)
    for h, w, peak in zip(hs, windows, got, strict=True):
        assert bits((peak,)) == bits((observed_peak(h, now, w),))
        assert bits((peak,)) == bits((old_observed_peak(h, now, w),))
    assert len(set(bits(tuple(got)))) > 2  # not one value for all


def test_the_row_peaks_are_pythons_max_of_each_row_to_the_last_bit() -> None:
    """Rows whose highest value is a zero of either sign (the first one Python meets),
    with a NaN before or after, an inf, ties, and plain rows: each peak is Python's."""
    rng = np.random.default_rng(5)
    rows = rng.choice([-0.0, 0.0, -1.0, 2.5, 2.5, 7.0], (60, 9))
    rows[::4] = np.minimum(rows[::4], 0.0)  # zeros of both signs on top
    rows[1::7, 0], rows[2::7, 5], rows[3::9, 2] = math.nan, math.nan, math.inf
    rows[4::9, 1] = -math.inf
    rows[:2] = [-0.0, 0.0, *[-1.0] * 7], [0.0, -0.0, *[-1.0] * 7]
    got = floor_rows._row_peaks(rows)
    assert bits(tuple(got)) == bits(tuple(max(row) for row in rows.tolist()))
    assert {struct.pack("<d", p) for p in got} >= {struct.pack("<d", z) for z in (0.0, -0.0)}
    with pytest.raises(ValueError):
        floor_rows._row_peaks(np.zeros((2, 0)))


def test_a_plan_of_many_floors_in_chunks_is_each_floor_decided_alone(
    chunk: int,
) -> None:
    decided, reasons = plans_are_each_floor_alone(13)
    assert decided
    assert any("forecast upper" in r for r in reasons)


@pytest.mark.parametrize("floats", [1, 250 * 7, 250 * 40 * 3, pairwise._LEVEL_FLOATS])
def test_window_means_over_rows_in_any_chunks_are_each_rows_own_to_the_last_bit(
    floats: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The level's zero-padded sums are taken a few rows at a time (`_LEVEL_FLOATS`):
    whatever the chunk, each row's means are the ones `_window_means` takes of it alone."""
    monkeypatch.setattr(pairwise, "_LEVEL_FLOATS", floats)
    rng = np.random.default_rng(floats)
    v = rng.normal(size=(11, 250)) * 100.0
    v[2, 17] = -0.0
    v[3] = np.round(v[3])  # ties
    order = rng.permutation(250)
    start = np.sort(rng.integers(0, 240, 40))
    stop = start + rng.integers(1, 11, 40)
    got = pairwise.window_means_rows(v, order, start, stop)
    for row, means in zip(v, got, strict=True):
        assert means.tobytes() == skill._window_means(row, order, start, stop).tobytes()
