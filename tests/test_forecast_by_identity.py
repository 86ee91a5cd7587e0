"""Values remembered for exact sequences of objects (`by_identity`, issue 20): found for
the very objects they were put for, in order, and for nothing else; forgotten with the
first object, and beyond `keep` the oldest first."""

from __future__ import annotations

import gc

from gpuscaler.core.forecast.by_identity import ByIdentity


class _Row:
    """A row object that can be weakly referenced."""


def test_a_value_is_found_for_the_same_objects_in_the_same_order_only() -> None:
    rows = [_Row() for _ in range(4)]
    memo: ByIdentity[_Row, str] = ByIdentity(8)
    memo.put(rows, "block")
    assert memo.get(rows) == "block"
    assert memo.get(list(rows)) == "block"  # another list of the same objects
    assert memo.get(rows[:3]) is None
    assert memo.get([rows[0], rows[2], rows[1], rows[3]]) is None
    assert memo.get([rows[0], rows[1], rows[2], _Row()]) is None
    assert memo.get([]) is None


def test_nothing_is_remembered_for_no_objects() -> None:
    memo: ByIdentity[_Row, str] = ByIdentity(8)
    memo.put([], "none")
    assert memo.get([]) is None


def test_a_value_goes_with_its_first_object_and_the_oldest_beyond_keep() -> None:
    memo: ByIdentity[_Row, int] = ByIdentity(2)
    rows = [_Row(), _Row()]
    key = id(rows[0])
    memo.put(rows, 1)
    assert key in memo
    del rows
    gc.collect()
    assert key not in memo
    kept = [[_Row()] for _ in range(3)]
    for i, one in enumerate(kept):
        memo.put(one, i)
    assert memo.get(kept[0]) is None  # the oldest, forgotten
    assert (memo.get(kept[1]), memo.get(kept[2])) == (1, 2)
