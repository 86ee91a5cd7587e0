"""Sums of zero-padded rows taken from their nonzero places only
(gpuscaler.core.pairwise.padded_sums) are numpy's own sums of the padded rows to the
last bit, for finite values (zeros of both signs, ties, cancellations, overflow to inf
and NaN from it included); and the skill's level over rows takes them only then."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuscaler.core import skill
from gpuscaler.core.model import FloatArray, IntArray
from gpuscaler.core.pairwise import _blocks, padded_sums

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


def test_the_blocks_are_numpys_pairwise_halves() -> None:
    assert _blocks(128) == [(0, 128)]
    assert _blocks(129) == [(0, 64), (64, 65)]
    assert _blocks(250) == [(0, 120), (120, 64), (184, 66)]
    assert sum(size for _, size in _blocks(1000)) == 1000


@pytest.mark.parametrize("rows", [skill._PAIRWISE_ROWS - 1, skill._PAIRWISE_ROWS, 40])
def test_the_level_over_rows_is_each_rows_own_with_or_without_the_pairwise_sums(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The skill's level takes the windows' values only from `_PAIRWISE_ROWS` rows and
    finite values: each row's means are the ones `_window_means` takes of it alone; a
    NaN sends them all to the padded sums, whose NaN they are."""
    used: list[int] = []

    def spy(v: FloatArray, windows: IntArray, places: IntArray, count: int) -> FloatArray:
        used.append(len(v))
        return padded_sums(v, windows, places, count)

    monkeypatch.setattr(skill, "padded_sums", spy)
    rng = np.random.default_rng(rows)
    v = values(rng, rows, 250, "zeros")
    order = np.arange(250)
    start = np.arange(0, 240, 2)
    stop = start + rng.integers(1, 11, start.size)
    for values_ in (v, np.where(np.arange(250) == 7, np.nan, v)):
        got = skill._window_means_rows(values_, order, start, stop)
        for row, means in zip(values_, got, strict=True):
            want = skill._window_means(row, order, start, stop)
            assert means.tobytes() == want.tobytes()
    assert used == ([rows] if rows >= skill._PAIRWISE_ROWS else [])
