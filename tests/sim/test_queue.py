"""The simulator's queue maths, on cases small enough to work out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscaler.sim.load import fluid_waits, lindley, wait_figures


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
    assert fluid_waits(np.array(work), np.array(served), slot=0.5)[0] == pytest.approx(wait)


def test_p99_and_the_violation_share_weight_each_slot_by_its_requests() -> None:
    p99, share = wait_figures(np.array([98.0, 1.0, 1.0]), np.array([0.0, 1.0, 5.0]), slo=2.0)
    assert p99 == 1.0  # the 99th of 100 requests waited 1 s
    assert share == pytest.approx(0.01)  # 1 in 100 waited longer than 2 s
    assert wait_figures(np.zeros(3), np.ones(3), slo=2.0) == (0.0, 0.0)  # no requests
