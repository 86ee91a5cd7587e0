"""The skill's level-floor bisection over rows as it was before `gpuscaler.core.at_cost`
(main ed31a8e, `gpuscaler/core/skill.py`, verbatim but for the names): every one of the
40 steps answered from sorted breakpoints and prefix sums over all rows, the rows' sums
where that was not sure. The oracle the new bisection is checked against, bit for bit."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from gpuscaler.core.model import FloatArray


def bisect_rows(reactive: FloatArray, base: FloatArray, extra: FloatArray) -> FloatArray:
    """The bisection of each row: every row's 40 steps taken together, each answered
    as `_cheap_excess` answers it (the same float operations, over rows) and, for the rows
    where it cannot, from the row's sum as `_exact_excess` takes it."""
    total = reactive.sum(axis=1)
    lo, hi = -np.max(base - reactive, axis=1) - 1.0, extra + 1.0
    with np.errstate(invalid="ignore", over="ignore"):
        cheap = _cheap_rows(reactive, base, total, extra)
        for _ in range(40):
            c = (lo + hi) / 2
            answer, sure = cheap(c)
            unsure = np.flatnonzero(~sure)
            if unsure.size:
                sums = np.maximum(reactive[unsure], base[unsure] + c[unsure, None]).sum(axis=1)
                answer[unsure] = sums - total[unsure] > extra[unsure]
            hi = np.where(answer, c, hi)
            lo = np.where(answer, lo, c)
    found: FloatArray = lo
    return found


def _cheap_rows(
    reactive: FloatArray, base: FloatArray, total: FloatArray, extra: FloatArray
) -> Callable[[FloatArray], tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]]:
    """`_cheap_excess` of each row: for a c per row, (the answer, whether it is sure)."""
    rows, n = reactive.shape
    finite = np.isfinite(reactive).all(axis=1) & np.isfinite(base).all(axis=1)
    finite &= np.isfinite(extra)
    d = reactive - base
    order = np.argsort(d, axis=1, kind="stable")
    ds = np.take_along_axis(d, order, axis=1)
    zero = np.zeros((rows, 1))
    base_below = np.concatenate((zero, np.cumsum(np.take_along_axis(base, order, 1), 1)), 1)
    sorted_r = np.take_along_axis(reactive, order, axis=1)
    reactive_above = np.concatenate((np.cumsum(sorted_r[:, ::-1], 1)[:, ::-1], zero), 1)
    scale = np.abs(reactive).sum(axis=1) + np.abs(base).sum(axis=1) + np.abs(total)
    scale = scale + np.abs(extra) + 1.0
    tol = 16 * (n + 4) * np.finfo(np.float64).eps
    below_all = ds[:, 0] - tol * (np.maximum(np.abs(ds[:, 0]), np.abs(ds[:, -1])) + 1.0)
    at = np.arange(rows)
    negative = extra < 0.0

    def over(c: FloatArray) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
        k = (ds < c[:, None]).sum(axis=1)
        below = c < below_all
        excess = base_below[at, k] + k * c + reactive_above[at, k] - total
        clear = np.abs(excess - extra) > tol * (scale + n * np.abs(c))
        answer = np.where(below, negative, excess > extra)
        return answer, finite & (below | clear)

    return over
