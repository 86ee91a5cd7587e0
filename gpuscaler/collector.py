"""Python's cyclic garbage collector paused while a block runs: one pause for the
controller's tick (gpuscaler.controller) and the Prometheus answers' decoding
(gpuscaler.adapters.prometheus.fast), which nest and may run in several threads."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_pause = threading.Lock()
_paused = 0
_resume = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a block runs (reference counting still
    frees what is dropped), on again when the last of the concurrent or nested blocks
    ends, unless it was off when the first began: never left off by a block.

    Why: a tick allocates a few objects a series (fit states, interval states,
    forecasts, signals) that live until the next tick, and decoding answers makes many
    acyclic lists and arrays; every 700 allocations the collector scanned the young
    objects and, now and then, the whole heap: some 7 % of a 100-lane what-if replay's
    CPU (issue 20), about 120 collections a 10,000-GPU tick's decoding (issue 18).
    A collection there finds nothing to free."""
    global _paused, _resume
    with _pause:
        if _paused == 0:
            _resume = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _pause:
            _paused -= 1
            if _paused == 0 and _resume:
                _promoted()
                gc.enable()


def _promoted() -> None:
    """The objects allocated since the collector was paused put with the oldest ones,
    unscanned (`gc.freeze` then `gc.unfreeze`: two list splices), unless something else
    keeps objects frozen (`gpuscaler.extender.run`): left young, the first allocation
    after the pause would scan them all (a tick's states, forecasts and observations,
    none of them garbage: about 1 ms a 50-lane tick of the what-if replay, and as much
    again in the older generations' scans, issue 20). Cyclic garbage made meanwhile
    waits for the next full collection: `_collect_when_due`."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()
        _collect_when_due()


FULL_SHARE = 0.002
"""The share of the process's CPU time the full collections run here may take: the next
runs once the CPU time since the last one ended is the last one's cost over this share."""
FULL_EVERY = 10.0
"""CPU seconds at least between two of them (and from the first paused block on)."""

_clock: Callable[[], float] = time.process_time
_collect: Callable[[], object] = gc.collect
_last: tuple[float, float] | None = None
"""(CPU time the last full collection here ended at, the CPU seconds it took)."""


def _collect_when_due() -> None:
    """A full collection when due (`FULL_SHARE`, `FULL_EVERY`): objects promoted by
    `_promoted` are not counted by CPython's own rule for one (a full collection once
    `long_lived_pending`, the objects its own collections moved to the oldest
    generation, exceeds a quarter of `long_lived_total`: Modules/gcmodule.c), so without
    this a long-running controller's cyclic garbage, if its ticks made any, would wait
    for the objects made outside its ticks to grow by a quarter. Costs one clock read a
    block; the objects are never counted (`gc.get_freeze_count` after `gc.freeze` walks
    the whole heap: 4 ms at 200,000 objects, 23 ms at 2 million)."""
    global _last
    now = _clock()
    if _last is None:
        _last = (now, 0.0)
    elif now - _last[0] >= max(FULL_EVERY, _last[1] / FULL_SHARE):
        _collect()
        ended = _clock()
        _last = (ended, ended - now)
