"""The skill's level floor at the forecast's cost, over rows: for each row, the c of the
40-step bisection in which every step asks whether
F(c) = sum(max(reactive, base + c)) - sum(reactive) is over `extra` (numpy's float sums),
the answer `lo` to the last bit, with a few numpy calls a step instead of a sum a step.

F is monotone in c: each max is, numpy's sum (one fixed order of additions, each rounded
monotonically) is. Its real counterpart g(c) = sum(max(0, c - d)), d = reactive - base,
is convex and piecewise linear, and its root, where g = extra, is found once from the
sorted breakpoints d (a segment by counting, one linear solve). Away from the root, F's
answer is g's: F's float sums and the breakpoints' prefix sums each differ from g by at
most about (n + 1) eps/2 of the sums' sizes (any order of n additions errs by at most
(n - 1) units of rounding of the sum of magnitudes), well within `MARGIN` (n + 4) eps
of them. So each step is answered by comparing its c with the edges of the band [a, b]
around the root where g is within that margin of `extra`, and only the steps whose c
falls inside the band (the last few) take F's sums. The step-by-step test this replaces
answered from breakpoints and prefix sums where it was sure (beyond 16 (n + 4) eps of
the sizes) and from F elsewhere: F's answer either way, as here. Below the lowest
breakpoint by that test's own tolerance (`below_all`) it answered `extra < 0`, as here.

Rows with a value that is not finite, or sums so large that their doubles could
overflow, take the steps as they were taken before (`stepped`): breakpoints and prefix
sums per step, the rows' sums where those are not sure.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from gpuscaler.core.model import FloatArray, IntArray

STEPS = 40
"""The bisection's steps."""

MARGIN = 8.0
"""The band's half-width in multiples of (n + 4) eps times the sums' sizes: about four
times what F's float sums, the breakpoints' prefix sums and the root's solve can err by
together (about 2 (n + 4) eps of the same sizes; the generated tests find answers that
differ at 0.01, none at 0.1)."""

EPS = float(np.finfo(np.float64).eps)

Bools = npt.NDArray[np.bool_]


def bisect_rows(reactive: FloatArray, base: FloatArray, extra: FloatArray) -> FloatArray:
    """The bisection's c of each row of (reactive, base) and its `extra`, as every step
    taken with the rows' sums gives it."""
    total = reactive.sum(axis=1)
    hi: FloatArray = extra + 1.0
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        a, b, regular, least = _band(reactive, base, total, extra)
    if regular.all():
        # -max(base - reactive) - 1.0: the lowest breakpoint is its exact negation (a
        # difference's negation is the negated difference's; a zero of either sign
        # gives -1.0), where every value is finite.
        lo: FloatArray = least - 1.0
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            _steps(reactive, base, total, extra, (lo, hi), (a, b))
        return lo
    lo = -np.max(base - reactive, axis=1) - 1.0
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        rows, others = np.flatnonzero(regular), np.flatnonzero(~regular)
        part = lo[rows], hi[rows]
        _steps(reactive[rows], base[rows], total[rows], extra[rows], part, (a[rows], b[rows]))
        lo[rows] = part[0]
        r, s, e = reactive[others], base[others], extra[others]
        lo[others] = stepped(r, s, total[others], e, lo[others], hi[others])
    return lo


def _band(
    reactive: FloatArray, base: FloatArray, total: FloatArray, extra: FloatArray
) -> tuple[FloatArray, FloatArray, Bools, FloatArray]:
    """Each row's band [a, b] (c under a: the answer is no; over b: yes), whether the
    row is regular (every value finite, its sums far from overflowing), and its lowest
    breakpoint (min(reactive - base) where regular)."""
    rows, n = reactive.shape
    ds = np.sort(reactive - base, axis=1)
    below = np.zeros((rows, n + 1))  # below[:, k]: the sum of the k lowest breakpoints
    np.cumsum(ds, axis=1, out=below[:, 1:])
    at_breaks = np.arange(n) * ds - below[:, :n]  # g at each breakpoint
    at = np.arange(rows)

    def root(x: FloatArray) -> FloatArray:
        """Where g = x (x >= 0): on the segment after the breakpoints where g <= x."""
        k = (at_breaks <= x[:, None]).sum(axis=1)
        found: FloatArray = (x + below[at, k]) / k
        return found

    size = np.abs(reactive).sum(axis=1) + np.abs(base).sum(axis=1) + np.abs(total)
    size += 2.0 * np.abs(extra) + 1.0
    margin = MARGIN * (n + 4) * EPS * size
    b = root(extra + margin)
    a = np.where(extra >= margin, root(extra - margin), _below_all(ds, n))
    negative = extra < 0.0  # F >= 0 > extra at every c: yes at every step
    a[negative] = b[negative] = -np.inf
    return a, b, np.isfinite(4.0 * size), ds[:, 0]  # regular: finite, no sum near overflow


def _below_all(ds: FloatArray, n: int) -> FloatArray:
    """Under this c, base + c rounds to at most reactive everywhere: F is 0 (the step-by-
    step test's own bound, answered `extra < 0` there)."""
    tol = 16 * (n + 4) * EPS
    found: FloatArray = ds[:, 0] - tol * (np.maximum(np.abs(ds[:, 0]), np.abs(ds[:, -1])) + 1.0)
    return found


def _steps(
    reactive: FloatArray,
    base: FloatArray,
    total: FloatArray,
    extra: FloatArray,
    bounds: tuple[FloatArray, FloatArray],
    band: tuple[FloatArray, FloatArray],
) -> None:
    """The steps of the regular rows, `bounds` (lo, hi) updated in place: yes over the
    band, no under it, the rows' sums inside it."""
    (lo, hi), (a, b) = bounds, band
    c = np.empty_like(lo)
    yes, maybe, near = (np.empty(lo.shape, dtype=np.bool_) for _ in range(3))
    for _ in range(STEPS):
        np.add(lo, hi, out=c)
        c /= 2
        np.greater(c, b, out=yes)
        np.greater_equal(c, a, out=maybe)
        np.greater(maybe, yes, out=near)  # in the band
        inside = near.nonzero()[0]
        if inside.size:
            yes[inside] = summed_over(reactive, base, total, extra, c, inside)
        np.putmask(hi, yes, c)  # copyto(where=)'s values, a quarter faster a call
        np.logical_not(yes, out=yes)
        np.putmask(lo, yes, c)


def summed_over(
    reactive: FloatArray,
    base: FloatArray,
    total: FloatArray,
    extra: FloatArray,
    c: FloatArray,
    rows: IntArray,
) -> Bools:
    """Whether F(c) is over `extra` in each of `rows`, from the row's float sum (each row
    summed alone, as numpy sums a row of a C-ordered array: the same bits however many
    rows are summed with it)."""
    if 2 * rows.size >= len(c):  # most rows (the last steps): all summed, none gathered
        every = np.maximum(reactive, base + c[:, None]).sum(axis=1) - total > extra
        picked: Bools = every[rows]
        return picked
    sums = np.maximum(reactive[rows], base[rows] + c[rows, None]).sum(axis=1)
    found: Bools = sums - total[rows] > extra[rows]
    return found


def stepped(
    reactive: FloatArray,
    base: FloatArray,
    total: FloatArray,
    extra: FloatArray,
    lo: FloatArray,
    hi: FloatArray,
) -> FloatArray:
    """The bisection step by step: each step answered from sorted breakpoints and prefix
    sums where that is sure, else from the row's sum."""
    cheap = _cheap_rows(reactive, base, total, extra)
    for _ in range(STEPS):
        c = (lo + hi) / 2
        answer, sure = cheap(c)
        unsure = np.flatnonzero(~sure)
        if unsure.size:
            answer[unsure] = summed_over(reactive, base, total, extra, c, unsure)
        hi = np.where(answer, c, hi)
        lo = np.where(answer, lo, c)
    return lo


def _cheap_rows(
    reactive: FloatArray, base: FloatArray, total: FloatArray, extra: FloatArray
) -> Callable[[FloatArray], tuple[Bools, Bools]]:
    """For a c per row, (whether F(c) is over `extra`, whether that is sure): from the
    breakpoints d = reactive - base (max(reactive, base + c) is base + c where d < c);
    not sure where the float sums could round either way (within a bound 4x the
    summation error's) or inputs are not finite."""
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
    tol = 16 * (n + 4) * EPS
    below_all = _below_all(ds, n)
    at = np.arange(rows)
    negative = extra < 0.0

    def over(c: FloatArray) -> tuple[Bools, Bools]:
        k = (ds < c[:, None]).sum(axis=1)
        below = c < below_all
        excess = base_below[at, k] + k * c + reactive_above[at, k] - total
        clear = np.abs(excess - extra) > tol * (scale + n * np.abs(c))
        answer = np.where(below, negative, excess > extra)
        return answer, finite & (below | clear)

    return over
