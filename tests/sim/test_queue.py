"""The simulator's queue maths, on cases small enough to work out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscaler.sim.load import Waits, lindley


def lindley_loop(q0: float, work: list[float], service: list[float]) -> list[float]:
    """The recursion itself, one slot at a time: the reference."""
    q, out = q0, []
    for a, c in zip(work, service, strict=True):
        q = max(0.0, q + a - c)
        out.append(q)
    return out


@pytest.mark.parametrize(
    ("q0", "work", "service", "queue", "served"),
    [
        # 3 units against 1 a slot: the queue holds 2, then drains; nothing is lost.
        (0.0, [3.0, 0.0, 0.0, 0.0], [1.0] * 4, [2.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]),
        (2.5, [0.5, 0.5], [1.0, 1.0], [2.0, 1.5], [1.0, 1.0]),  # the carried queue first
    ],
)
def test_work_beyond_capacity_waits_for_the_next_slots_instead_of_being_dropped(
    q0: float, work: list[float], service: list[float], queue: list[float], served: list[float]
) -> None:
    got_queue, got_served = lindley(q0, np.array(work), np.array(service))
    assert (got_queue.tolist(), got_served.tolist()) == (queue, served)


@pytest.mark.parametrize("seed", range(5))
def test_the_vectorised_recursion_equals_the_slot_by_slot_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    work = rng.exponential(1.0, 300)
    service = rng.uniform(0.5, 1.5, 300)
    q0 = float(rng.uniform(0, 3))
    queue, served = lindley(q0, work, service)
    np.testing.assert_allclose(queue, lindley_loop(q0, list(work), list(service)), atol=1e-9)
    np.testing.assert_allclose(q0 + work.sum() - served.sum(), queue[-1], atol=1e-9)


def _waits(work: list[float], served: list[float], blocks: list[int], slo: float = 2.0) -> Waits:
    """One run of `work` and `served` fed in `blocks` slots at a time, one request a slot."""
    w = np.array([work])
    waits = Waits(w, np.ones_like(w), np.array([0]), 0.5, 0, slo, np.array([0]))
    at = 0
    for size in blocks:
        waits.feed(np.array([served[at : at + size]]))
        at += size
    return waits


@pytest.mark.parametrize(
    ("work", "served", "wait"),
    [
        ([0.5, 0.5], [0.5, 0.5], 0.0),  # served in its own slot: no wait
        # 3 units, 1 a slot: the last is done when cumulative service reaches 3, at the
        # end of slot 2, 1 s after slot 0 ended.
        ([3.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], 1.0),
        # 1.5 then 1, 1 a slot: slot 0's last half unit is done halfway through slot 1.
        ([1.5, 1.0], [1.0, 1.0], 0.25),
        ([5.0, 0.0], [1.0, 1.0], 0.5),  # never served: waits until the run's end at least
    ],
)
def test_a_slots_last_request_waits_until_cumulative_service_reaches_its_work(
    work: list[float], served: list[float], wait: float
) -> None:
    waits = _waits(work, served, [len(work)])
    waits.finish()
    assert waits.waits[0, 0] == pytest.approx(wait)


@pytest.mark.parametrize("seed", range(6))
def test_the_waits_and_figures_are_the_same_whatever_blocks_the_service_comes_in(
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    n = 400
    work = rng.exponential(1.0, n) * (rng.random(n) < 0.7)
    capacity = rng.uniform(0.3, 1.6, n) * (1 + np.sin(np.arange(n) / 40))
    served = lindley(0.0, work, capacity)[1]
    whole = _waits(list(work), list(served), [n], slo=1.0)
    cuts = np.sort(rng.choice(np.arange(1, n), 20, replace=False))
    blocked = _waits(list(work), list(served), np.diff(np.r_[0, cuts, n]).tolist(), slo=1.0)
    figures = whole.finish(), blocked.finish()
    np.testing.assert_array_equal(whole.waits, blocked.waits)
    np.testing.assert_array_equal(*figures)


@pytest.mark.parametrize("seed", range(6))
def test_p99_and_the_violation_share_of_each_run_weight_each_slot_by_its_requests(
    seed: int,
) -> None:
    rng = np.random.default_rng(seed)
    n, runs = 300, 3
    work = rng.exponential(1.0, (1, n))
    requests = rng.integers(0, 20, (1, n)).astype(float)
    served = np.stack([lindley(0.0, work[0], rng.uniform(0.5, c, n))[1] for c in (1.1, 1.3, 2)])
    waits = Waits(work, requests, np.zeros(runs, dtype=np.int64), 0.5, 50, 1.0, np.arange(runs))
    for block in np.array_split(served, 7, axis=1):
        waits.feed(block)
    figures = waits.finish()
    counts = requests[0, 50:]
    for run, (p99, share) in enumerate(zip(*figures, strict=True)):
        each = waits.waits[run, 50:]
        order = np.argsort(each, kind="stable")  # the definition: the 99th request's wait
        at = np.searchsorted(np.cumsum(counts[order]), 0.99 * counts.sum())
        assert p99 == each[order][at]
        assert share == pytest.approx(counts[each > 1.0].sum() / counts.sum(), rel=1e-12)


def test_a_run_without_requests_has_no_wait_figures() -> None:
    w = np.ones((1, 4))
    waits = Waits(w, np.zeros_like(w), np.array([0]), 0.5, 0, 2.0, np.array([], dtype=np.int64))
    waits.feed(np.zeros((1, 4)))
    assert [f.tolist() for f in waits.finish()] == [[0.0], [0.0]]
