"""A target's window of `forecast.fit_step` buckets (adapters/prometheus/window.py): its
means are those of the raw samples bucketed, however the reads cut and repeat them."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.adapters.prometheus.backfill import Folds, Pending
from gpuscaler.adapters.prometheus.plan import chunks
from gpuscaler.adapters.prometheus.window import Window, decode_range
from gpuscaler.core.forecast.members import bucket_means
from gpuscaler.core.model import FloatArray

STEP, WIDTH, SIZE = 0.5, 10.0, 12


def _raw_means(times: FloatArray, values: FloatArray, end: float) -> FloatArray:
    """The raw samples on the step grid ending at `end`, bucketed by the forecaster."""
    grid = np.full(round(SIZE * WIDTH / STEP), np.nan)
    idx = np.rint((times - end) / STEP).astype(int) + grid.size - 1
    ok = (idx >= 0) & (idx < grid.size)
    grid[idx[ok]] = values[ok]
    return bucket_means(grid, STEP, end, WIDTH, end)


def _read(window: Window, times: FloatArray, values: FloatArray, start: float, end: float) -> None:
    """A read of the samples in [start, end], then the window sealed as the reader does."""
    inside = (times >= start) & (times <= end)
    window.write(times[inside], values[inside])
    window.fetched_until = end
    window.seal(end - 5.0)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    ticks=st.lists(st.floats(1.0, 40.0), min_size=1, max_size=8),
    gaps=st.floats(0.0, 0.6),
)
def test_the_bucketed_window_equals_the_raw_samples_bucketed(
    seed: int, ticks: list[float], gaps: float
) -> None:
    """Ticks of any spacing, each reading what is new plus 5 s of overlap, with gaps in
    the samples: the window's means are the raw samples' bucket means."""
    rng = np.random.default_rng(seed)
    now = 1_000.0
    times = np.arange(now - SIZE * WIDTH * 2, now + sum(ticks) + 1, STEP)
    values = rng.uniform(0, 100, times.size)
    values[rng.random(times.size) < gaps] = np.nan
    window = Window(step=STEP, width=WIDTH, size=SIZE)
    window.advance(now)
    _read(window, times, values, now - SIZE * WIDTH, np.floor(now / STEP) * STEP)
    for dt in ticks:
        now += dt
        end = np.floor(now / STEP) * STEP
        assert window.fetched_until is not None
        window.advance(now)
        _read(window, times, values, window.fetched_until - 5.0, end)
    series = window.series()
    assert series.step == WIDTH and abs(series.end - now) <= WIDTH / 2
    seen = times <= np.floor(now / STEP) * STEP
    want = _raw_means(times[seen], values[seen], series.end)
    np.testing.assert_allclose(series.values, want, rtol=1e-12, equal_nan=True)


def test_a_re_read_overlap_and_a_late_sample_are_counted_once() -> None:
    window = Window(step=STEP, width=WIDTH, size=SIZE)
    window.advance(100.0)
    times = np.arange(80.5, 100.5, STEP)
    window.write(times, np.full(times.size, 10.0))
    window.fetched_until = 100.0
    window.seal(95.0)  # (80, 90] sealed into its bucket; (90, 100] stays raw
    window.advance(106.0)  # the bucket ending at 110 holds what is read so far
    again = np.arange(95.0, 105.5, STEP)  # the 5 s overlap read again, then what is new
    late = np.where(again == 97.0, 40.0, 10.0)  # a sample changed since: the newer counts
    window.write(again, late)
    means = window.series().values
    np.testing.assert_allclose(means[-3:], [10.0, 10.0 + 30.0 / 20, 10.0])
    assert np.isnan(means[:-3]).all()


def test_a_series_handed_out_keeps_its_values_when_the_window_moves_on() -> None:
    window = Window(step=STEP, width=1.0, size=4)
    window.advance(10.0)  # buckets ending at 7 to 10 s
    window.write(np.array([9.0, 10.0]), np.array([1.0, 2.0]))
    before = window.series()
    window.advance(11.0)
    window.write(np.array([10.5, 11.0]), np.array([3.0, 5.0]))
    np.testing.assert_array_equal(before.values, [np.nan, np.nan, 1.0, 2.0])
    np.testing.assert_array_equal(window.series().values, [np.nan, 1.0, 2.0, 4.0])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), pieces=st.integers(1, 7), start=st.floats(0.0, 30.0))
def test_a_backfill_read_in_chunks_sharing_their_edges_counts_each_sample_once(
    seed: int, pieces: int, start: float
) -> None:
    """Chunks share their edge sample and the first read holds the span's end: the
    backfill's buckets hold each sample of [start, end) once."""
    rng = np.random.default_rng(seed)
    start = np.ceil(start / STEP) * STEP
    end = 100.0
    times = np.arange(0.0, end + 1, STEP)
    values = rng.uniform(0, 100, times.size)
    window = Window(step=STEP, width=WIDTH, size=SIZE)
    window.advance(end)
    folds = Folds({"k": Pending(window, "q", start, end, (0.0, 100.0))})
    for c0, c1 in chunks(start, end, STEP, pieces):
        inside = (times >= c0) & (times <= c1)
        pairs = zip(times[inside].tolist(), values[inside].tolist(), strict=True)
        points = [[t, repr(v)] for t, v in pairs]
        folds.take(("q", c0, c1), decode_range([{"metric": {}, "values": points}]))
    fold = folds.by_key["k"]
    assert fold.failed is None and fold.refused is None and window.buckets is not None
    window.buckets.add_buckets(fold.buckets)  # as Backfill.apply does
    held = (times >= start) & (times < end)
    want = _raw_means(times[held], values[held], window.series().end)
    np.testing.assert_allclose(window.series().values, want, rtol=1e-12, equal_nan=True)
