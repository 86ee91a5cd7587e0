"""`gpuscaler whatif`'s progress bar on a terminal: workloads done, share of control ticks
done, range queries sent, time taken and left. Worker processes report through a queue."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Any, TextIO

WIDTH = 30
"""Characters of the bar."""
ESTIMATE_FROM = 0.02
"""The share of the replay done before the time left is estimated (elapsed x left / done)."""

_QUEUE: Any = None
"""In a worker process: the queue its progress goes to (`worker_init`), or None."""


class Progress:
    """A one-line progress bar on a terminal; silent otherwise."""

    def __init__(
        self, out: TextIO, total: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.out, self.total, self.done, self.requests = out, total, 0, 0
        self.on = out.isatty()
        self.clock, self.start = clock, clock()
        self.shares: dict[int, tuple[int, float]] = {}
        """Each lockstep chunk's (workloads, share of its ticks done)."""

    def request(self, n: int) -> None:
        self.requests += n
        self.show()

    def workload(self, key: str) -> None:
        self.done += 1
        self.show(key)

    def replayed(self, chunk: int, size: int, share: float) -> None:
        """Chunk `chunk`, of `size` workloads, has ticked `share` of its range."""
        self.shares[chunk] = (size, share)
        self.show()

    def share(self) -> float:
        total = max(self.total, 1)  # workloads done, or the chunks' ticks, whichever is more
        ticked = sum(size * share for size, share in self.shares.values()) / total
        return min(1.0, max(self.done / total, ticked))

    def show(self, key: str = "") -> None:
        if not self.on:
            return
        share = self.share()
        filled = round(WIDTH * share)
        elapsed = self.clock() - self.start
        left = ""
        if ESTIMATE_FROM <= share < 1.0:
            left = f", about {_minutes(elapsed * (1 - share) / share)} left"
        self.out.write(
            f"\r[{'#' * filled}{'.' * (WIDTH - filled)}] {self.done}/{self.total} workloads, "
            f"{self.requests} range queries, {_minutes(elapsed)}{left} {key[:40]:<40}"
        )
        self.out.flush()

    def close(self) -> None:
        if self.on:
            self.out.write("\n")


def _minutes(seconds: float) -> str:
    whole = max(0, round(seconds))
    return f"{whole // 60}:{whole % 60:02d}"


def worker_init(to: Any) -> None:
    """A worker process' initializer: one BLAS thread; its progress goes to the queue `to`
    (None: nowhere)."""
    from gpuscaler.setup import one_blas_thread

    global _QUEUE
    one_blas_thread()
    _QUEUE = to


def reporters(chunk: int, size: int) -> tuple[Callable[[int], None], Callable[[float], None]]:
    """In a worker: (range queries sent, share of ticks done) callbacks of chunk `chunk`."""
    to = _QUEUE
    if to is None:
        return (lambda _n: None), (lambda _share: None)
    return (lambda n: to.put(("requests", n))), (lambda s: to.put(("replayed", chunk, size, s)))


def drain(source: Any, bar: Progress) -> None:
    """Show every message waiting on the workers' queue `source` (None: none)."""
    while source is not None:
        try:
            message = source.get_nowait()
        except queue.Empty:
            return
        if message[0] == "requests":
            bar.request(message[1])
        else:
            bar.replayed(message[1], message[2], message[3])
