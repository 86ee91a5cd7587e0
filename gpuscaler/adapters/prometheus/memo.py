"""What a tick's grouped reads fetched, answered from memory (issue 18): the per-target
reads of `PrometheusMetrics._fetch` ask `MemoTransport`, which answers what the grouped
queries prefetched, keyed by (query, start, end) in the chunks `chunks` computes (the
same as `_fetch`'s), and sends only what they did not cover to the real transport."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gpuscaler.adapters.prometheus.fast import fast_query_range
from gpuscaler.adapters.prometheus.source import MAX_POINTS
from gpuscaler.adapters.prometheus.transport import SourceError, Transport

Chunk = tuple[float, float]
"""A range query's (start, end) in whole seconds, or an instant query's (time, INSTANT)."""
INSTANT = math.inf
AnswerKey = tuple[str, float, float]
Answer = list[Any] | SourceError
"""A query's `data.result`, or the error it failed with (raised when `_fetch` asks)."""


class MemoTransport:
    """Answers prefetched for this tick, else the real transport (and counts those)."""

    def __init__(self, real: Transport, answers: Mapping[AnswerKey, Answer]):
        self.real = real
        self.answers = answers
        self.fallbacks = 0

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Any]:
        found = self.answers.get((query, int(start), int(end)))
        if isinstance(found, SourceError):
            raise found
        if found is not None:
            return found
        self.fallbacks += 1
        return fast_query_range(self.real, query, start, end, step)

    def query(self, query: str, time: float | None = None) -> list[Any]:
        found = self.answers.get((query, time, INSTANT)) if time is not None else None
        if isinstance(found, SourceError):
            raise found
        if found is not None:
            return found
        self.fallbacks += 1
        return self.real.query(query, time)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def chunks(start: float, end: float, step: float, pieces: int = 1) -> list[Chunk]:
    """The (start, end) pairs `PrometheusMetrics._fetch` asks for, in whole seconds; with
    `pieces`, cut into at least that many (a backfill's parallel chunks)."""
    out: list[Chunk] = []
    size = math.floor(MAX_POINTS * step)
    if pieces > 1:
        size = max(1, min(size, math.ceil((math.floor(end) - math.floor(start)) / pieces)))
    last = math.floor(end)
    t = math.floor(start)
    while True:
        chunk_end = min(last, t + size)
        out.append((t, chunk_end))
        if chunk_end >= last:
            return out
        t = chunk_end


def split_answer(
    by: tuple[str, ...],
    members: list[tuple[tuple[str, ...], str]],
    chunk: Chunk,
    answers: dict[AnswerKey, Answer],
    result: Answer,
) -> None:
    """One grouped answer cut into the per-target answers it holds; a failed one stores
    nothing, so each target is asked on its own, and so does a target the answer holds
    twice (series not aggregated: the workload rule's). An instant answer is complete: a
    pool it does not hold has no sample in its lookback, so its own query would be empty."""
    if isinstance(result, SourceError) or not isinstance(result, list):
        return
    by_values: dict[tuple[str, ...], Any] = {}
    twice = set()
    for item in result:
        metric = (item.get("metric") or {}) if isinstance(item, dict) else {}
        values = tuple(str(metric.get(label, "")) for label in by)
        if values in by_values:
            twice.add(values)
        by_values[values] = item
    for values, query in members:
        if values in twice:
            continue
        item = by_values.get(values)
        if item is not None:
            answers[(query, *chunk)] = [item]
        elif chunk[1] == INSTANT:
            answers[(query, *chunk)] = []
