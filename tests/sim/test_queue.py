"""The simulator's queue maths, on cases small enough to work out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscaler.sim.queue import fluid_waits, lindley, wait_figures


def lindley_loop(q0: float, work: list[float], service: list[float]) -> list[float]:
    """The recursion itself, one slot at a time: the reference."""
    q, out = q0, []
    for a, c in zip(work, service, strict=True):
        q = max(0.0, q + a - c)
        out.append(q)
    return out


def test_work_beyond_capacity_waits_for_the_next_slots_instead_of_being_dropped() -> None:
    # 3 units arrive against 1 unit of service a slot: the queue holds 2, then drains.
    queue, served = lindley(0.0, np.array([3.0, 0.0, 0.0, 0.0]), np.array([1.0] * 4))
    assert queue.tolist() == [2.0, 1.0, 0.0, 0.0]
    assert served.tolist() == [1.0, 1.0, 1.0, 0.0]
    assert served.sum() == 3.0  # nothing lost


def test_a_carried_queue_is_served_before_new_work() -> None:
    queue, served = lindley(2.5, np.array([0.5, 0.5]), np.array([1.0, 1.0]))
    assert queue.tolist() == [2.0, 1.5]
    assert served.tolist() == [1.0, 1.0]


@pytest.mark.parametrize("seed", range(5))
def test_the_vectorised_recursion_equals_the_slot_by_slot_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    work = rng.exponential(1.0, 300)
    service = rng.uniform(0.5, 1.5, 300)
    q0 = float(rng.uniform(0, 3))
    queue, served = lindley(q0, work, service)
    np.testing.assert_allclose(queue, lindley_loop(q0, list(work), list(service)), atol=1e-9)
    np.testing.assert_allclose(q0 + work.sum() - served.sum(), queue[-1], atol=1e-9)


def test_a_request_served_in_its_own_slot_does_not_wait() -> None:
    waits = fluid_waits(np.array([0.5, 0.5]), np.array([0.5, 0.5]), slot=0.5)
    assert waits.tolist() == [0.0, 0.0]


def test_the_last_request_of_a_burst_waits_until_cumulative_service_reaches_its_work() -> None:
    # Slot 0 brings 3 units; service is 1 a slot. Its last request is done when the
    # cumulative service reaches 3: at the end of slot 2, 1 s after slot 0 ended.
    work = np.array([3.0, 0.0, 0.0, 0.0])
    served = np.array([1.0, 1.0, 1.0, 0.0])
    waits = fluid_waits(work, served, slot=0.5)
    assert waits[0] == pytest.approx(1.0)


def test_service_spread_evenly_inside_the_slot_that_finishes_the_work() -> None:
    # 1.5 units at slot 0, 1 at slot 1, service 1 a slot: slot 0's last half unit is
    # done halfway through slot 1, 0.25 s after slot 0 ended.
    waits = fluid_waits(np.array([1.5, 1.0]), np.array([1.0, 1.0]), slot=0.5)
    assert waits[0] == pytest.approx(0.25)


def test_work_never_served_waits_at_least_until_the_end_of_the_run() -> None:
    waits = fluid_waits(np.array([5.0, 0.0]), np.array([1.0, 1.0]), slot=0.5)
    assert waits[0] == pytest.approx(0.5)  # run ends 0.5 s after slot 0 did


def test_p99_and_the_violation_share_weight_each_slot_by_its_requests() -> None:
    counts = np.array([98.0, 1.0, 1.0])
    waits = np.array([0.0, 1.0, 5.0])
    p99, share = wait_figures(counts, waits, slo=2.0)
    assert p99 == 1.0  # the 99th of 100 requests waited 1 s
    assert share == pytest.approx(0.01)  # 1 in 100 waited longer than 2 s


def test_no_requests_mean_no_waits() -> None:
    assert wait_figures(np.zeros(3), np.ones(3), slo=2.0) == (0.0, 0.0)
