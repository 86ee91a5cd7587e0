"""An interval issued by a batch keeps its bounds as a row of the batch's array until read
(issue 20); it reads, compares, hashes and prints as the interval made from tuples."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscaler.core.model import IssuedInterval


def _rows() -> np.ndarray:
    rng = np.random.default_rng(3)
    lower = rng.normal(50, 10, (4, 6))
    rows = np.stack([lower, lower + rng.uniform(0, 5, (4, 6))], axis=1)
    rows[2, 0, 3] = np.nan  # a NaN bound reads back as NaN
    rows.flags.writeable = False
    return rows


@pytest.mark.parametrize("row", range(4))
def test_an_interval_in_a_batchs_rows_reads_and_compares_as_one_made_from_tuples(row: int) -> None:
    rows = _rows()
    lazy = IssuedInterval.in_rows(100.0, 10.0, rows, row)
    eager = IssuedInterval(100.0, 10.0, tuple(rows[row, 0].tolist()), tuple(rows[row, 1].tolist()))
    assert repr(lazy) == repr(eager)  # every bound, NaN too
    if row != 2:  # NaN != NaN, as between the tuples
        assert lazy.lower == eager.lower and lazy.upper == eager.upper
        assert lazy == eager and hash(lazy) == hash(eager)


@pytest.mark.parametrize(
    ("origin", "step", "row", "equal"),
    [
        (100.0, 10.0, 0, True),
        (110.0, 10.0, 0, False),  # another origin
        (100.0, 5.0, 0, False),  # another step
        (100.0, 10.0, 1, False),  # other bounds
    ],
)
def test_intervals_are_equal_only_with_the_same_origin_step_and_bounds(
    origin: float, step: float, row: int, equal: bool
) -> None:
    rows = _rows()
    a = IssuedInterval.in_rows(100.0, 10.0, rows, 0)
    b = IssuedInterval.in_rows(origin, step, rows, row)
    assert (a == b) is equal
    assert (a != b) is not equal
    assert (a == (100.0, 10.0)) is False  # not an interval


def test_an_issued_interval_cannot_be_changed_once_made() -> None:
    lazy = IssuedInterval.in_rows(100.0, 10.0, _rows(), 0)
    eager = IssuedInterval(100.0, 10.0, (1.0,), (2.0,))
    for interval in (lazy, eager):
        with pytest.raises(AttributeError, match="immutable"):
            interval.origin = 5.0
    before = lazy.lower
    assert lazy.lower is before  # read once, then kept


def test_intervals_made_together_are_each_the_one_made_alone_from_its_row() -> None:
    rows = _rows()
    made = IssuedInterval.many(100.0, 10.0, rows, [3, 0, 2])
    alone = [IssuedInterval.in_rows(100.0, 10.0, rows, r) for r in (3, 0, 2)]
    assert [repr(m) for m in made] == [repr(a) for a in alone]
    assert [(m.origin, m.step) for m in made] == [(100.0, 10.0)] * 3
    with pytest.raises(AttributeError, match="immutable"):
        made[0].step = 1.0
