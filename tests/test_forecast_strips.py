"""Issue 20: a batch's kept recent errors are rolled on as windows of a wider buffer
(`strips`), not copied every tick. The oracle is the copy: the kept errors without the
oldest, the new ones after them, compared bit for bit tick after tick (strips filled
and copied on), and no window handed out ever changes."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscaler.core.forecast import strips
from gpuscaler.core.forecast.blocks import as_rows
from gpuscaler.core.model import FloatArray


def _rows(block: FloatArray) -> list[FloatArray]:
    """Rows (depth, steps) of a (n, steps, depth) block, as `score` hands them out."""
    return as_rows(np.ascontiguousarray(block.swapaxes(1, 2)))


@pytest.mark.parametrize("seed", range(4))
def test_rolled_windows_equal_the_copies_tick_after_tick(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, steps, depth = 3, 4, 5
    want = rng.normal(size=(n, steps, depth))
    want[0, 1, 2] = np.nan
    rows = _rows(want)
    handed: list[tuple[list[FloatArray], FloatArray]] = []
    for _ in range(3 * strips.SLACK):
        j = int(rng.integers(1, 3))
        old = int(rng.integers(0, j + 1)) if want.shape[2] < 9 else j
        new = rng.normal(size=(n, steps, j))
        want = np.concatenate([want[:, :, old:], new], axis=2)
        rows = strips.rolled(rows, old, new)
        assert strips.kept(rows).tobytes() == want.tobytes()
        assert all(not r.flags.writeable for r in rows)
        handed.append((rows, want))
    for got, was in handed:  # every window keeps its values
        assert np.stack(got).swapaxes(1, 2).tobytes() == was.tobytes()


def test_rows_rolled_twice_get_windows_of_their_own() -> None:
    rng = np.random.default_rng(7)
    base = rng.normal(size=(2, 3, 6))
    rows = strips.rolled(_rows(base), 1, rng.normal(size=(2, 3, 1)))
    first_new, second_new = rng.normal(size=(2, 3, 1)), rng.normal(size=(2, 3, 1))
    first = strips.rolled(rows, 1, first_new)
    kept_first = strips.kept(first).copy()
    second = strips.rolled(rows, 1, second_new)
    assert strips.kept(first).tobytes() == kept_first.tobytes()
    assert strips.kept(second)[:, :, -1:].tobytes() == second_new.tobytes()
    assert strips.kept(second)[:, :, :-1].tobytes() == strips.kept(rows)[:, :, 1:].tobytes()
    assert strips.kept(rows[::-1]).tobytes() == strips.kept(rows)[::-1].tobytes()
