"""The controller keeps Python's cyclic garbage collector off during a tick and turns it
back on after (issue 20), whatever the tick does; a caller that had it off finds it off."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator, Sequence

import pytest
from builders import config

from gpuscaler.collector import gc_paused
from gpuscaler.controller import Controller
from gpuscaler.core.decisions import Decision
from gpuscaler.core.snapshot import Observations


class Source:
    """Records whether the collector was on when observed; raises when told to."""

    name = "probe"

    def __init__(self, fail: bool = False) -> None:
        self.seen: list[bool] = []
        self.fail = fail

    def observe(self, now: float) -> Observations:
        self.seen.append(gc.isenabled())
        if self.fail:
            raise RuntimeError("source failed")
        return Observations(now)


class NoActuator:
    def apply(self, decisions: Sequence[Decision]) -> tuple[Decision, ...]:
        return tuple(decisions)


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


@pytest.mark.usefixtures("collector_on")
@pytest.mark.parametrize("fail", [False, True])
def test_the_collector_is_off_during_a_tick_and_on_after_it_even_a_failed_one(fail: bool) -> None:
    source = Source(fail)
    controller = Controller(config(), source, NoActuator())
    for now in (1000.0, 1030.0):
        result = controller.safe_tick(now)
        assert (result is None) is fail
        assert gc.isenabled()
    assert source.seen == [False, False]
    assert controller.stats.failed == (2 if fail else 0)


@pytest.mark.usefixtures("collector_on")
def test_a_caller_that_turned_the_collector_off_finds_it_off_after_a_tick() -> None:
    gc.disable()
    try:
        Controller(config(), Source(), NoActuator()).tick(1000.0)
        assert not gc.isenabled()
    finally:
        gc.enable()  # as every other test found it


@pytest.mark.usefixtures("collector_on")
def test_pauses_in_several_threads_never_leave_the_collector_off() -> None:
    start = threading.Barrier(4)

    def pause() -> None:
        start.wait()
        for _ in range(200):
            with gc_paused():
                pass

    threads = [threading.Thread(target=pause) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert gc.isenabled()


class Node:
    """A tracked object that can form a cycle."""

    def __init__(self) -> None:
        self.other: object = None


@pytest.mark.usefixtures("collector_on")
def test_what_a_paused_block_made_goes_to_the_oldest_generation_unscanned() -> None:
    collections: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.collect()
    gc.callbacks.append(seen)
    try:
        with gc_paused():
            made = [Node() for _ in range(2_000)]  # over a young collection's threshold
        after = [Node() for _ in range(10)]  # would start a collection of the 2,000
        oldest = {id(o) for o in gc.get_objects(generation=2)}
    finally:
        gc.callbacks.remove(seen)
    assert collections == []
    assert all(id(o) in oldest for o in made) and after
    assert gc.get_freeze_count() == 0


@pytest.mark.usefixtures("collector_on")
def test_cycles_a_paused_block_dropped_are_still_collected_by_a_full_collection() -> None:
    with gc_paused():
        a, b = Node(), Node()
        a.other, b.other = b, a
        probe = weakref.ref(a)
        del a, b
    assert probe() is not None  # a cycle: reference counting alone does not free it
    gc.collect()
    assert probe() is None


@pytest.mark.usefixtures("collector_on")
def test_objects_someone_else_froze_stay_frozen_after_a_paused_block() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with gc_paused():
            made = [Node() for _ in range(10)]
        assert gc.get_freeze_count() == frozen
        assert made
    finally:
        gc.unfreeze()


class Clock:
    """CPU seconds as the collector reads them; a full collection takes `cost` of them."""

    def __init__(self, cost: float) -> None:
        self.now, self.cost = 1000.0, cost
        self.collections: list[float] = []
        self.real = True
        """Whether its collections collect (or are only counted)."""

    def __call__(self) -> float:
        return self.now

    def collect(self) -> int:
        self.collections.append(self.now)
        self.now += self.cost
        return gc.collect() if self.real else 0


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    import gpuscaler.collector as collector

    fake = Clock(cost=0.2)
    monkeypatch.setattr(collector, "_clock", fake)
    monkeypatch.setattr(collector, "_collect", fake.collect)
    monkeypatch.setattr(collector, "_last", None)
    return fake


@pytest.mark.usefixtures("collector_on")
def test_cycles_paused_blocks_dropped_are_collected_once_enough_cpu_time_passed(
    clock: Clock,
) -> None:
    with gc_paused():
        pass  # the first block: the time from which the next is counted
    with gc_paused():
        a, b = Node(), Node()
        a.other, b.other = b, a
        probe = weakref.ref(a)
        del a, b
    clock.now += 9.0  # under FULL_EVERY (10 s)
    with gc_paused():
        pass
    assert probe() is not None and clock.collections == []
    clock.now += 1.0
    with gc_paused():
        pass
    assert probe() is None and clock.collections == [1010.0]


@pytest.mark.usefixtures("collector_on")
@pytest.mark.parametrize(
    ("cost", "every", "expected"),
    [
        (0.25, 1.0, 8),  # at 1011 s (FULL_EVERY after the first block), then 125.25 s apart
        (2**-7, 1.0, 99),  # cheap ones: FULL_EVERY apart (10 s + their cost)
        (1.0, 1.0, 2),  # 1011, 1512: 500 s apart (+ their cost)
        (0.25, 64.0, 8),  # blocks a minute apart: every other block from the second on
    ],
)
def test_full_collections_take_at_most_their_share_of_the_cpu_time(
    clock: Clock, cost: float, every: float, expected: int
) -> None:
    clock.cost, clock.real = cost, False
    end = clock.now + 1000.0
    while clock.now < end:
        with gc_paused():
            clock.now += every
    assert len(clock.collections) == expected
    spent = cost * len(clock.collections)
    assert spent <= 0.002 * 1000.0 + cost  # within the share, give or take the last one
