"""The tick's queries on one thread pool kept for the process, at most
`prometheus.max_concurrent_queries` at a time: the grouped queries first, then what they
did not cover (`plan.py`). A range answer is decoded on the thread that fetched it, so no
answer's JSON outlives its request.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from gpuscaler.adapters.prometheus.plan import (
    INSTANT,
    Answer,
    AnswerKey,
    Chunk,
    Group,
    Plan,
    Store,
    chunks,
    split_answer,
)
from gpuscaler.adapters.prometheus.rules import PoolRules, check_query
from gpuscaler.adapters.prometheus.transport import SourceError, Transport
from gpuscaler.adapters.prometheus.window import decode_range
from gpuscaler.config import Config

Job = tuple[str, Chunk, Callable[[Answer], None]]
"""A query, its chunk, and what takes its answer."""
Span = Callable[[str], "tuple[float, float] | None"]
Cuts = dict[AnswerKey, list[Chunk]]
"""The chunks a (query, start, end) span was read in."""


@dataclass
class Prefetched:
    answers: dict[AnswerKey, Answer] = field(default_factory=dict)
    cuts: Cuts = field(default_factory=dict)


class Fetcher:
    """Queries on a kept pool; counts those of the tick (`queries`)."""

    def __init__(self, config: Config, transport: Transport):
        self.config = config
        self.transport = transport
        self.rules = PoolRules()
        self.queries = 0
        """Queries sent for the tick since it was last reset."""
        self._pool = self._new_pool()

    def _new_pool(self) -> ThreadPoolExecutor:
        workers = self.config.prometheus.max_concurrent_queries
        return ThreadPoolExecutor(workers, thread_name_prefix="prometheus")

    def reconfigure(self, config: Config, transport: Transport) -> None:
        workers = self.config.prometheus.max_concurrent_queries
        self.config, self.transport = config, transport
        if config.prometheus.max_concurrent_queries != workers:
            self._pool.shutdown(wait=False)
            self._pool = self._new_pool()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def query(self, query: str, chunk: Chunk) -> Answer:
        try:
            if chunk[1] == INSTANT:
                return self.transport.query(query, chunk[0])
            return decode_range(self.transport.query_range(query, *chunk, self.config.metrics.step))
        except SourceError as e:
            return e

    def run(self, jobs: list[Job], counted: bool = True) -> None:
        """The queries on the pool, each answer given to its taker in order. The backfill's
        are not counted, and go a pool's worth at a time, so that a tick's queries wait
        behind one such wave at most."""
        if counted:
            self.queries += len(jobs)
        wave = len(jobs) if counted else self.config.prometheus.max_concurrent_queries
        for first in range(0, len(jobs), max(1, wave)):
            part = jobs[first : first + wave]
            futures = [(self._submit(q, c), take) for q, c, take in part]
            for future, take in futures:
                take(future.result())

    def ask(self, query: str, chunk: Chunk) -> Answer:
        self.queries += 1
        return self._submit(query, chunk).result()

    def _submit(self, query: str, chunk: Chunk) -> Future[Answer]:
        try:
            return self._pool.submit(self.query, query, chunk)
        except RuntimeError:  # the pool was closed with the source
            closed: Future[Answer] = Future()
            closed.set_result(SourceError("the Prometheus source is closed"))
            return closed

    def check_rules(self, now: float) -> None:
        """Which pools Prometheus records (`rules.py`), when queries are grouped."""
        grouped = self.config.prometheus.grouped_queries
        if not (grouped and self.rules.needs_check(self.config, now)):
            return
        step = self.config.metrics.step
        answer = self.ask(check_query(), (math.floor(now / step) * step, INSTANT))
        self.rules.update(now, answer, self.config)

    def prefetch(
        self,
        plan: Plan,
        now: float,
        span_of: Span,
        resting: set[str],
        backfill: bool = False,
        pieces: int = 1,
        sink: Store | None = None,
    ) -> Prefetched:
        """Every answer the reads of `span_of`'s ranges will ask for (not the totals
        `resting`): the grouped queries first, then what they did not cover. A
        `backfill` reads only ranges, cut into `pieces`, uncounted, each answer given to
        `sink` as it arrives."""
        step = self.config.metrics.step
        got = Prefetched()
        seen: set[AnswerKey] = set()

        def store(key: AnswerKey, answer: Answer) -> None:
            seen.add(key)
            (sink or got.answers.__setitem__)(key, answer)

        jobs: list[Job] = []
        instant = (math.floor(now / step) * step, INSTANT)
        for g in plan.groups:
            if g.instant:
                members = [(v, query) for v, (k, query) in g.targets.items() if k not in resting]
                if not backfill and members:
                    take = partial(split_answer, g.by, members, instant, store)
                    jobs.append((g.query, instant, take))
                continue
            by_span: dict[tuple[float, float], list[tuple[tuple[str, ...], str]]] = {}
            for values, (key, query) in g.targets.items():
                span = span_of(key)
                if span is not None:
                    by_span.setdefault(span, []).append((values, query))
            for span, members in by_span.items():
                cut = chunks(*span, step, pieces, series=len(members))
                got.cuts.update({(query, *span): cut for _, query in members})
                for chunk in cut:
                    take = partial(split_answer, g.by, members, chunk, store)
                    if g.recorded and not backfill:  # not the backfill's older spans
                        take = partial(self._split_recorded, take, members, chunk, seen)
                    jobs.append((g.query, chunk, take))
        self.run(jobs, counted=not backfill)
        if not backfill:
            self.run(_stale_jobs(plan.groups, instant, got.answers, store))
        jobs = []
        uncovered = plan.single + [(*t, g.instant) for g in plan.groups for t in g.targets.values()]
        for key, query, is_instant in uncovered:
            if key in resting:
                continue
            if is_instant:
                wanted = [] if backfill else [instant]
            else:
                span = span_of(key)
                wanted = [] if span is None else got.cuts.get((query, *span), [])
                if span is not None and not wanted:
                    wanted = got.cuts[(query, *span)] = chunks(*span, step, pieces)
            jobs += [
                (query, chunk, partial(store, (query, *chunk)))
                for chunk in wanted
                if (query, *chunk) not in seen
            ]
        self.run(jobs, counted=not backfill)
        return got

    def _split_recorded(
        self,
        split: Callable[[Answer], None],
        members: list[tuple[tuple[str, ...], str]],
        chunk: Chunk,
        seen: set[AnswerKey],
        result: Answer,
    ) -> None:
        """A pool a recorded answer misses is read raw for now (`rules.note_missing`)."""
        split(result)
        if isinstance(result, list):
            self.rules.note_missing([q for _, q in members if (q, *chunk) not in seen])


def _stale_jobs(
    groups: list[Group], instant: Chunk, answers: dict[AnswerKey, Answer], store: Store
) -> list[Job]:
    jobs: list[Job] = []
    for g in groups:
        if g.stale is None:
            continue
        empty = {v for v, (_, q) in g.targets.items() if answers.get((q, *instant)) == []}
        members = [(v, q) for v, (_, q) in g.stale.targets.items() if v in empty]
        if members:
            take = partial(split_answer, g.by, members, instant, store)
            jobs.append((g.stale.query, instant, take))
    return jobs
