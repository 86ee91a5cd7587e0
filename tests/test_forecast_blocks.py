"""Kept per-series arrays handed out as rows of one batch array (issue 20): read back
together they are that array itself, anything else is stacked as before."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from gpuscaler.core.forecast.blocks import as_rows, stacked


def _block(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(5, 3, 4))


@pytest.mark.parametrize("swapped", [False, True])
def test_all_the_rows_in_order_give_back_their_block_without_a_copy(swapped: bool) -> None:
    block = _block()
    rows = as_rows(block, swapped)
    got = stacked(rows)
    assert np.shares_memory(got, block) and not got.flags.writeable
    np.testing.assert_array_equal(got, np.stack([r.copy() for r in rows]))
    assert rows[0].shape == ((4, 3) if swapped else (3, 4))


@pytest.mark.parametrize(
    "pick",
    [
        lambda rows: rows[1:],  # a subset
        lambda rows: rows[::-1],  # another order
        lambda rows: [rows[0], rows[2], rows[1], rows[3], rows[4]],  # first and last in place
        lambda rows: [rows[0], *(r.copy() for r in rows[1:])],  # equal values, other arrays
    ],
)
def test_any_other_rows_are_stacked_as_np_stack_stacks_them(pick: object) -> None:
    block = _block(1)
    rows = pick(as_rows(block))  # type: ignore[operator]
    got = stacked(rows)
    assert not np.shares_memory(got, block)
    np.testing.assert_array_equal(got, np.stack(rows))


def test_rows_of_a_block_that_does_not_own_its_memory_are_stacked() -> None:
    owner = _block(2)
    view = owner[1:]  # its rows do not keep `view` itself alive
    rows = as_rows(view)
    got = stacked(rows)
    assert not np.shares_memory(got, owner)
    np.testing.assert_array_equal(got, view)


def test_rows_are_read_only_and_keep_their_block_alive_not_the_registry() -> None:
    rows = as_rows(_block(3))
    with pytest.raises(ValueError):
        rows[0][0, 0] = 1.0
    want = np.stack([r.copy() for r in rows])
    gc.collect()
    np.testing.assert_array_equal(stacked(rows), want)  # the block lives while its rows do


def test_a_block_that_is_gone_leaves_nothing_behind() -> None:
    from gpuscaler.core.forecast import blocks

    rows = as_rows(_block(4))
    key = id(rows[0])
    assert key in blocks._blocks
    del rows
    gc.collect()
    assert key not in blocks._blocks
