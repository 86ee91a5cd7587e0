"""The controller keeps Python's cyclic garbage collector off during a tick and turns it
back on after (issue 20), whatever the tick does; a caller that had it off finds it off."""

from __future__ import annotations

import gc
import threading
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
