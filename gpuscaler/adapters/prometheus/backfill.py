"""Background backfill: a window's first read fetches only what a forecast needs, so
the first tick acts in the time of a few steady ones; the older part is read behind it,
on a thread started once the tick is done, by the same grouped queries in parallel
chunks. Each answer is folded into its target's buckets as it arrives; the next read
adds them to the windows (only the tick's thread touches a window). A failed chunk is
asked again behind the next tick; a window rebuilt meanwhile is not written into.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from gpuscaler.adapters.prometheus.plan import Answer, AnswerKey
from gpuscaler.adapters.prometheus.transport import SourceError
from gpuscaler.adapters.prometheus.window import (
    Buckets,
    Window,
    bucket_index,
    drop_outside,
    one_series,
)

log = logging.getLogger("gpuscaler.prometheus")


@dataclass(frozen=True)
class Pending:
    """The part of a target's window its first read left out: `start` to before `end`."""

    window: Window
    query: str
    start: float
    end: float
    bounds: tuple[float, float]


@dataclass
class Fold:
    """A target's backfill so far: its buckets, or a failure (asked again) or refusal."""

    pending: Pending
    buckets: Buckets
    failed: SourceError | None = None
    refused: str | None = None
    absurd: list[str] = field(default_factory=list)


class Folds:
    """The answers of a backfill folded into their targets' buckets as they arrive."""

    def __init__(self, batch: Mapping[str, Pending]):
        self.by_key: dict[str, Fold] = {}
        self._by_query: dict[str, list[Fold]] = {}
        self.seen: set[AnswerKey] = set()
        for key, p in batch.items():
            first, last = bucket_index(np.array([p.start, p.end]), p.window.width).tolist()
            fold = Fold(p, Buckets.empty(p.window.width, first, last - first + 1))
            self.by_key[key] = fold
            self._by_query.setdefault(p.query, []).append(fold)

    def take(self, key: AnswerKey, answer: Answer) -> None:
        """One chunk's answer into the buckets of the targets asking its query: the
        samples in the pending span, after the chunk's start but in its first chunk
        (chunks share their edge sample)."""
        self.seen.add(key)
        query, chunk_start, _ = key
        for fold in self._by_query.get(query, []):
            if isinstance(answer, SourceError):
                fold.failed = answer
                continue
            try:
                times, values, _ = one_series(answer)
            except SourceError as e:
                fold.refused = str(e)
                continue
            p = fold.pending
            values = values.copy()  # the answer may serve several targets
            if absurd := drop_outside(values, p.bounds):
                fold.absurd.append(absurd)
            keep = (times >= p.start) & (times < p.end)
            if chunk_start > p.start:
                keep &= times > chunk_start
            fold.buckets.add(times[keep], values[keep])


Fetch = Callable[[Mapping[str, Pending]], Folds]


class Backfill:
    """What the first reads left out, fetched on a thread, applied by `apply`."""

    def __init__(self, fetch: Fetch):
        self.fetch = fetch
        self.pending: dict[str, Pending] = {}
        self._thread: threading.Thread | None = None
        self._result: tuple[dict[str, Pending], Folds | None] | None = None
        self._closed = False

    def close(self) -> None:
        """Nothing more is started; a fetch failing as the process stops is not reported."""
        self._closed = True
        self.pending.clear()

    @property
    def busy(self) -> bool:
        return bool(self.pending) or self._thread is not None

    def start(self) -> None:
        if not self.pending or self._thread is not None or self._closed:
            return
        batch, self.pending = self.pending, {}

        def run() -> None:
            folds: Folds | None
            try:
                folds = self.fetch(batch)
            except Exception as e:  # a thread's failure must not be silent: asked again
                if self._closed:
                    log.info("backfill stopped with the process: %s", e)
                    return
                log.exception("backfill failed; asked again next tick")
                folds = None
            self._result = (batch, folds)

        self._thread = threading.Thread(target=run, name="prometheus-backfill", daemon=True)
        self._thread.start()

    def wait(self, timeout: float) -> bool:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()

    def apply(self, windows: Mapping[str, Window]) -> int:
        """Add a finished fetch's buckets to the windows; the number of targets filled."""
        thread, result = self._thread, self._result
        if thread is None or thread.is_alive():
            return 0
        self._thread, self._result = None, None
        assert result is not None  # set by the finished thread
        batch, folds = result
        filled = 0
        for key, p in batch.items():
            window = windows.get(key)
            if window is not p.window or window.buckets is None:
                continue
            fold = folds.by_key.get(key) if folds is not None else None
            failed = "the fetch failed" if fold is None else fold.failed
            if failed is not None:
                log.info("backfill of %s failed (%s); asked again next tick", key, failed)
                self.pending.setdefault(key, p)
                continue
            assert fold is not None
            if fold.refused is not None:
                log.warning("backfill of %s refused: %s", key, fold.refused)
                continue
            for absurd in fold.absurd:
                log.warning("backfill of %s: %s (kept out of the window)", key, absurd)
            window.buckets.add_buckets(fold.buckets)
            filled += 1
        log.info("backfilled %d window(s) behind the first tick", filled)
        return filled
