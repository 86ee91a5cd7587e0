"""Sums of zero-padded rows taken from their nonzero places only
(gpuscaler.core.pairwise.padded_sums) are numpy's own sums of the padded rows to the
last bit, for finite values (zeros of both signs, ties, cancellations, overflow to inf
and NaN from it included); and the skill's level over rows takes them only then."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.core import pairwise, skill
from gpuscaler.core.model import FloatArray, IntArray
from gpuscaler.core.pairwise import Layout, _blocks, padded_sums

LENGTHS = [1, 3, 7, 8, 9, 15, 16, 17, 64, 100, 127, 128, 129, 136, 200, 250, 256, 257, 513]
"""Row lengths around numpy's pairwise steps: under 8 (one by one), lanes of 8, a
block of 128, the halves of 129 and more (at multiples of 8), several levels deep."""


def padded(v: FloatArray, windows: IntArray, places: IntArray, count: int) -> FloatArray:
    """The oracle: the rows as the skill's level builds them, summed by numpy."""
    filled = np.zeros((len(v), count, v.shape[1]))
    filled[:, windows, places] = v[:, places]
    found: FloatArray = filled.sum(axis=2)
    return found


def case(
    rng: np.random.Generator, n: int, rows: int, count: int, runs: bool
) -> tuple[IntArray, IntArray]:
    """Windows of runs of places (the level's) or scattered places, entries shuffled."""
    windows: list[int] = []
    places: list[int] = []
    for w in range(count):
        if runs:
            first = int(rng.integers(0, n))
            chosen = np.arange(first, first + int(rng.integers(1, min(n - first, 40) + 1)))
        else:
            chosen = rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False)
        windows += [w] * len(chosen)
        places += chosen.tolist()
    shuffle = rng.permutation(len(windows))
    return np.asarray(windows)[shuffle], np.asarray(places)[shuffle]


def values(rng: np.random.Generator, rows: int, n: int, kind: str) -> FloatArray:
    v = rng.normal(size=(rows, n)) * 10.0 ** rng.integers(-3, 3, (rows, n))
    if kind == "huge":  # cancellations and sums that overflow to inf (and inf - inf)
        v *= 10.0 ** rng.integers(0, 300, (rows, n))
    elif kind == "zeros":
        v = np.where(rng.random((rows, n)) < 0.5, rng.choice([0.0, -0.0], (rows, n)), v)
    elif kind == "ties":
        v = np.round(v)
    found: FloatArray = v
    return found


@pytest.mark.parametrize("kind", ["normal", "huge", "zeros", "ties"])
@pytest.mark.parametrize("n", LENGTHS)
def test_padded_sums_are_numpys_sums_of_the_padded_rows_to_the_last_bit(n: int, kind: str) -> None:
    rng = np.random.default_rng(n)
    for trial in range(12):
        rows, count = int(rng.integers(1, 6)), int(rng.integers(1, 12))
        windows, places = case(rng, n, rows, count, runs=trial % 2 == 0)
        v = values(rng, rows, n, kind)
        with np.errstate(over="ignore", invalid="ignore"):
            want, got = padded(v, windows, places, count), padded_sums(v, windows, places, count)
        assert got.shape == want.shape
        assert got.tobytes() == want.tobytes()


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 300),
    rows=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
    runs=st.booleans(),
    kind=st.sampled_from(["normal", "huge", "zeros", "ties"]),
)
def test_generated_windows_sum_as_numpy_sums_the_padded_rows(
    n: int, rows: int, seed: int, runs: bool, kind: str
) -> None:
    rng = np.random.default_rng(seed)
    windows, places = case(rng, n, rows, int(rng.integers(1, 8)), runs)
    v = values(rng, rows, n, kind)
    count = int(windows.max()) + 1
    with np.errstate(over="ignore", invalid="ignore"):
        want, got = padded(v, windows, places, count), padded_sums(v, windows, places, count)
    assert got.tobytes() == want.tobytes()


def means_are_each_rows_own(
    v: FloatArray, order: IntArray, start: IntArray, stop: IntArray
) -> None:
    """The level over rows: each row's means are the ones `_window_means` takes of it
    alone, to the last bit."""
    with np.errstate(invalid="ignore"):
        got = pairwise.window_means_rows(v, order, start, stop)
        for row, means in zip(v, got, strict=True):
            assert means.tobytes() == skill._window_means(row, order, start, stop).tobytes()


def test_the_blocks_are_numpys_pairwise_halves() -> None:
    assert _blocks(128) == [(0, 128)]
    assert _blocks(129) == [(0, 64), (64, 65)]
    assert _blocks(250) == [(0, 120), (120, 64), (184, 66)]
    assert sum(size for _, size in _blocks(1000)) == 1000


@pytest.mark.parametrize("rows", [1, 12, 19, 40])
def test_the_level_over_rows_is_each_rows_own_with_or_without_the_pairwise_sums(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The skill's level takes the windows' values only for the rows whose values are
    all finite, at any number of rows: each row's means are the ones `_window_means`
    takes of it alone; a row with a NaN or an inf is summed padded, and its NaN is the
    padded sum's (NaNs of both signs in a window can sum to another NaN from the
    windows' values only)."""
    used: list[int] = []

    def spy(
        v: FloatArray, windows: IntArray, places: IntArray, count: int, kept: Layout | None
    ) -> FloatArray:
        used.append(len(v))
        return padded_sums(v, windows, places, count, kept)

    monkeypatch.setattr(pairwise, "padded_sums", spy)
    rng = np.random.default_rng(rows)
    v = values(rng, rows, 250, "zeros")
    order = np.arange(250)
    start = np.arange(0, 240, 2)
    stop = start + rng.integers(1, 11, start.size)
    spoilt = v.copy()
    spoilt[::3, 7:40:3], spoilt[::3, 8:40:5] = np.nan, -np.nan  # NaNs of both signs meet
    spoilt[1::3, 60] = -np.inf
    means_are_each_rows_own(v, order, start, stop)
    means_are_each_rows_own(spoilt, order, start, stop)
    assert used == [rows] + ([len(range(2, rows, 3))] if rows > 2 else [])


@pytest.mark.parametrize("floats", [1, 250 * 7, 250 * 40 * 3, pairwise._LEVEL_FLOATS])
def test_rows_not_finite_are_summed_padded_in_any_chunks_to_the_last_bit(
    floats: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The zero-padded sums of the rows that are not finite, a few rows at a time
    (`_LEVEL_FLOATS`): whatever the chunk, each row's means are its own alone."""
    monkeypatch.setattr(pairwise, "_LEVEL_FLOATS", floats)
    rng = np.random.default_rng(floats)
    v = values(rng, 11, 250, "ties")
    v[:, 3], v[4, 100], v[5, 101], v[7, 150:160] = np.nan, np.inf, -np.inf, -np.nan
    start = np.sort(rng.integers(0, 240, 40))
    means_are_each_rows_own(v, rng.permutation(250), start, start + rng.integers(1, 11, 40))


def test_a_window_set_seen_before_reuses_its_layout_and_sums_the_same() -> None:
    """The layout of a window set is kept (the same windows tick after tick: the skill's
    level, `window_means_rows`): the means taken with the kept layout are each row's own
    alone, for new values."""
    rng = np.random.default_rng(9)
    order = rng.permutation(250)
    start = np.sort(rng.integers(0, 240, 20))
    stop = start + rng.integers(1, 11, 20)
    pairwise._places.cache_clear()
    for _ in range(3):
        means_are_each_rows_own(values(rng, 3, 250, "normal"), order, start, stop)
    info = pairwise._places.cache_info()
    assert (info.misses, info.hits) == (1, 2)


def test_rows_with_nans_of_both_signs_and_infinities_keep_the_padded_sums_nans() -> None:
    """From the windows' values only, NaNs of both signs and inf - inf can sum to
    another NaN than numpy's padded sum (3 of these 40 rows would): such rows are
    summed padded, each row's means its own alone to the last bit."""
    rng = np.random.default_rng(0)
    order, start = np.arange(250), np.arange(0, 200, 5)
    stop = start + 25
    v = rng.normal(size=(40, 250))
    for row in v[1:]:  # the first row finite: taken from its windows' values
        k = rng.integers(0, 250, 6)
        row[k[:2]], row[k[2:4]], row[k[4]], row[k[5]] = np.nan, -np.nan, np.inf, -np.inf
    means_are_each_rows_own(v, order, start, stop)
