"""Background backfill: a window's first read fetches only what a forecast
needs (`forecast.min_history`, plus `prometheus.overlap` for a late or missing sample),
so the first tick after a start acts in the time of a few steady ticks instead of after
reading the whole window; the older part is read behind it, on a thread started once the
tick is done (`Controller.tick` calls the source's `after_tick`), by the same grouped
queries cut into parallel chunks, and written into the windows at the start of the next
read (only the tick's thread touches a window).

A chunk that failed is asked again behind the next tick; a target whose query changed
meanwhile (a reload, a coarse series found) is dropped from the backfill, since its
window was rebuilt.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from gpuscaler.adapters.prometheus.transport import SourceError
from gpuscaler.adapters.prometheus.window import Window, decode_matrix, drop_outside

log = logging.getLogger("gpuscaler.prometheus")

Answers = Mapping[tuple[str, float, float], object]
Fetch = Callable[[Mapping[str, "Pending"]], Answers]
"""Fetches what is pending: the answers by (query, chunk start, chunk end)."""
Cut = Callable[[float, float], list[tuple[float, float]]]
"""The chunks a span is fetched in."""


@dataclass(frozen=True)
class Pending:
    """The part of a target's window its first read left out."""

    window: Window
    """The window it belongs to: a window rebuilt since (a reload, a coarse series found)
    is not written into."""
    query: str
    start: float
    end: float
    bounds: tuple[float, float]


class Backfill:
    """What the first reads left out, fetched on a thread, applied by `apply`."""

    def __init__(self, fetch: Fetch, cut: Cut):
        self.fetch, self.cut = fetch, cut
        self.pending: dict[str, Pending] = {}
        self._thread: threading.Thread | None = None
        self._result: tuple[dict[str, Pending], Answers] | None = None
        self._closed = False

    def close(self) -> None:
        """The process stops: nothing more is started, and a fetch still running that
        fails for it (its connection pool gone) is not reported as a failure."""
        self._closed = True
        self.pending.clear()

    def note(self, key: str, pending: Pending) -> None:
        self.pending[key] = pending

    @property
    def busy(self) -> bool:
        return bool(self.pending) or self._thread is not None

    def start(self) -> None:
        """Fetch what is pending, unless a fetch is still running."""
        if not self.pending or self._thread is not None or self._closed:
            return
        batch, self.pending = self.pending, {}

        def run() -> None:
            try:
                answers = self.fetch(batch)
            except Exception as e:  # a thread's failure must not be silent: asked again
                if self._closed:
                    log.info("backfill stopped with the process: %s", e)
                    return
                log.exception("backfill failed; asked again next tick")
                answers = {}
            self._result = (batch, answers)

        self._thread = threading.Thread(target=run, name="prometheus-backfill", daemon=True)
        self._thread.start()

    def wait(self, timeout: float) -> bool:
        """True when no fetch is running (after waiting up to `timeout` seconds)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()

    def apply(self, windows: Mapping[str, Window]) -> int:
        """Write a finished fetch into the windows; the number of targets filled."""
        thread, result = self._thread, self._result
        if thread is None or thread.is_alive():
            return 0
        self._thread, self._result = None, None
        assert result is not None  # set by the finished thread
        batch, answers = result
        filled = 0
        for key, p in batch.items():
            window = windows.get(key)
            if window is not p.window or window.end is None:
                continue
            got = [answers.get((p.query, *chunk)) for chunk in self.cut(p.start, p.end)]
            failed = next((a for a in got if isinstance(a, SourceError) or a is None), False)
            if failed is not False:
                log.info("backfill of %s failed (%s); asked again next tick", key, failed)
                self.pending.setdefault(key, p)
                continue
            filled += _write(key, window, got, p.bounds)
        log.info("backfilled %d window(s) behind the first tick", filled)
        return filled


def _write(key: str, window: Window, answers: list[object], bounds: tuple[float, float]) -> int:
    """The answers' finite samples into the window; 1 when written, 0 when refused."""
    for answer in answers:
        try:
            times, values, _ = decode_matrix(answer)
        except SourceError as e:
            log.warning("backfill of %s refused: %s", key, e)
            return 0
        absurd = drop_outside(values, bounds)
        if absurd is not None:
            log.warning("backfill of %s: %s (kept out of the window)", key, absurd)
        keep = np.isfinite(values)
        window.write(times[keep], values[keep])
    return 1
