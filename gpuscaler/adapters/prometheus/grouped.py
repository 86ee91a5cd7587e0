"""Grouped, concurrent Prometheus reads (issue 18): a tick's queries no longer grow with
the number of targets.

`GroupedPrometheusMetrics` is a `PrometheusMetrics` that, before the tick's per-target
reads, fetches what they would fetch in few queries, run concurrently, and answers the
per-target reads from memory:
- **pools**: pools whose `metrics_matchers` are one equality on the same label (a "pool
  family", e.g. `modelName`) share one query per signal:
  `avg by (modelName) (last_over_time(DCGM_FI_DEV_GPU_UTIL{modelName=~"A|B"}[1s]))`;
  each series answers the pool with that label value; a `modelName` pool's utilization
  and stall come from the series the shipped pool rules record, where Prometheus records
  them (`rules.py`: one series per pool for Prometheus to read instead of one per GPU);
- **workloads**: one query over the recording rule `gpuscaler:workload_gpu_utilization:sum`
  (deploy/prometheus/prometheusrule.yaml), which sums GPU utilization by (namespace,
  workload) with the workload taken from the pod's name (Deployment
  `<name>-<hash>-<id>`, StatefulSet `<name>-<ordinal>`, either pod label convention);
- a target whose matchers or template do not fit a group, or that the grouped answer
  does not cover (the rule not installed, a workload named unlike its pods), is read with
  its own per-target query, still concurrently, so the grouped form never loses a target.

Frame-buffer signals: grouped instant queries (`source._newest_gib`; the total every few
minutes, `total.py`). Answers are decoded by orjson (`fast.py`), keyed by (query, start,
end) in `_fetch`'s chunks; steady reads are written at once (`bulk.py`); a first read
fetches what a forecast needs, the rest follows behind (`backfill.py`)."""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gpuscaler.adapters.prometheus.backfill import Backfill, Pending
from gpuscaler.adapters.prometheus.bulk import steady_reads
from gpuscaler.adapters.prometheus.fast import fast_query, fast_query_range
from gpuscaler.adapters.prometheus.memo import (
    INSTANT,
    Answer,
    AnswerKey,
    Chunk,
    MemoTransport,
    chunks,
    split_answer,
)
from gpuscaler.adapters.prometheus.promql import (
    HOSTNAME_LABELS,
    build_query,
    build_workload_query,
    escape_label_value,
    grouped_template,
)
from gpuscaler.adapters.prometheus.rules import PoolRules, check_query, recorded_template
from gpuscaler.adapters.prometheus.source import Metrics, PrometheusMetrics
from gpuscaler.adapters.prometheus.spacing import lookback_ms
from gpuscaler.adapters.prometheus.transport import SourceError
from gpuscaler.config import Config, ForecastConfig

WORKLOAD_RULE = "gpuscaler:workload_gpu_utilization:sum"
"""Recorded by deploy/prometheus/prometheusrule.yaml: GPU utilization summed by
(namespace, workload)."""
DEFAULT_WORKLOAD_TEMPLATE = "sum(last_over_time(DCGM_FI_DEV_GPU_UTIL{{{matchers}}}[{lookback}]))"
"""The per-target workload query the rule stands for; a custom template is read per
target, since the rule cannot know what it computes."""


@dataclass
class _Group:
    """One grouped query and the targets it answers: label values -> (key, query)."""

    query: str
    by: tuple[str, ...]
    targets: dict[tuple[str, ...], tuple[str, str]] = field(default_factory=dict)
    instant: bool = False
    """An instant query at the grid's end (the frame-buffer signals), else a range query
    over what is new."""
    stale: _Group | None = None
    """An instant group's second try, over `metrics.staleness`, for the targets the
    first (over the step's lookback) found nothing of (`_newest_gib`)."""
    recorded: bool = False
    """Over a pool recording rule's series (`rules.py`), not the raw per-GPU ones."""


_Plan = tuple[list[_Group], list[tuple[str, str, bool]]]  # see `_groups`


class GroupedPrometheusMetrics(PrometheusMetrics):
    """Prometheus metrics read by a few grouped queries a tick, concurrently."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.queries_last_tick = 0
        self._count_lock = threading.Lock()
        self.backfill = Backfill(self._backfill_fetch, self._backfill_cut)
        self._head: tuple[Config, float] | None = None
        self.rules = PoolRules()
        self._plan: tuple[Config, object, _Plan] | None = None

    # ------------------------------------------------------------------ planning

    def _start(self, key: str, now: float) -> tuple[float, float]:
        """(start, end) `_fetch` will ask for `key` this tick."""
        step = self.config.metrics.step
        size = round(self.config.metrics.window / step)
        end = math.floor(now / step) * step
        first = end - step * (size - 1)
        window = self.windows.get(key)
        if window is None or window.fetched_until is None:
            return self._head_start(first, end), end
        return max(first, window.fetched_until - self.config.prometheus.overlap), end

    def _head_start(self, first: float, end: float) -> float:
        """Where a first read starts: `forecast.min_history` (the longest any target's
        forecast asks for) plus `prometheus.overlap` before `end`, unless the window is
        read whole (`prometheus.background_backfill` off)."""
        if not self.config.prometheus.background_backfill:
            return first
        if self._head is None or self._head[0] is not self.config:
            c = self.config
            longest = max(
                [c.forecast.min_history]
                + [
                    c.pool_section(p.name, "forecast", ForecastConfig).min_history
                    for p in c.node_pools
                ]
                + [
                    c.workload_section(w.key, "forecast", ForecastConfig).min_history
                    for w in c.workloads
                ]
            )
            self._head = (c, longest + c.prometheus.overlap)
        return max(first, end - self._head[1])

    def _first_start(
        self, key: str, query: str, first: float, end: float, bounds: tuple[float, float]
    ) -> float:
        start = self._head_start(first, end)
        if start > first:
            self.backfill.note(key, Pending(self.windows[key], query, first, start, bounds))
        return start

    def _first_start_done(self, key: str) -> None:
        self.backfill.pending.pop(key, None)

    def _backfill_cut(self, start: float, end: float) -> list[Chunk]:
        return chunks(start, end, self.config.metrics.step, self._pieces)

    @property
    def _pieces(self) -> int:
        return self.config.prometheus.max_concurrent_queries

    def _backfill_fetch(self, batch: Mapping[str, Pending]) -> dict[AnswerKey, Answer]:
        """What the first reads left out: by the grouped queries, then one by one."""
        spans = {k: (p.start, p.end) for k, p in batch.items()}
        answers = self.prefetch(max(p.end for p in batch.values()), spans, self._pieces)
        jobs: list[tuple[str, Chunk, Callable[[Answer], None]]] = [
            (p.query, chunk, partial(answers.__setitem__, (p.query, *chunk)))
            for p in batch.values()
            for chunk in self._backfill_cut(p.start, p.end)
            if (p.query, *chunk) not in answers
        ]
        self._run(jobs, counted=False)
        return answers

    def _groups(self) -> _Plan:
        """Grouped queries, and the (key, query, instant) that must be read one by one:
        planned once per config, series found coarse and pools recorded, not per tick."""
        state, plan = (dict(self.spacing.measured), dict(self.rules.recorded)), self._plan
        if plan is None or plan[0] is not self.config or plan[1] != state:
            plan = self._plan = (self.config, state, self._plan_groups())
        return plan[2]

    def _plan_groups(self) -> _Plan:
        q = self.config.prometheus.queries
        signals = [
            ("util", q.pool_utilization, False),
            ("stall", q.pool_stall, False),
            ("fb_used", q.pool_memory_used, True),
            ("fb_total", q.pool_memory_total, True),
        ]
        families: dict[str, list[tuple[str, str]]] = {}
        single: list[tuple[str, str, bool]] = []
        for p in self.config.node_pools:
            if not p.metrics_matchers:
                continue
            (label, value), *more = p.metrics_matchers.items()
            if more or label in HOSTNAME_LABELS:
                single += [
                    (key, build_query(t, p.metrics_matchers, self._lookback_of(key, i)), i)
                    for s, t, i in signals
                    for key in [f"pool:{p.name}:{s}"]
                ]
            else:
                families.setdefault(label, []).append((p.name, value))
        groups = []
        for label, pools in families.items():
            for signal, template, instant in signals:
                recorded, raw = self.rules.split(self.config, signal, label, template, pools)
                for members, rule in ((recorded, True), (raw, False)):
                    if not members:
                        continue
                    group, alone = self._family_group(
                        label, members, signal, template, instant, rule
                    )
                    groups += [group] if group is not None else []
                    single += alone
        workload = self._workload_group()
        if workload is not None:
            groups.append(workload)
            covered = {key for key, _ in workload.targets.values()}
            single += [(k, q, False) for k, q in self._workload_queries() if k not in covered]
        else:
            single += [(k, q, False) for k, q in self._workload_queries()]
        return groups, single

    def _family_group(
        self,
        label: str,
        pools: list[tuple[str, str]],
        signal: str,
        template: str,
        instant: bool,
        recorded: bool = False,
    ) -> tuple[_Group | None, list[tuple[str, str, bool]]]:
        """One signal's grouped query over a pool family (over the pool recording rule's
        series when `recorded`), and the pools read on their own."""
        key = {name: f"pool:{name}:{signal}" for name, _ in pools}
        # A series sampled coarser than the step (adapters/prometheus/spacing.py) needs
        # its own lookback: it is read on its own. Frame-buffer figures have their own
        # fallback (`_newest_gib`) instead.
        coarse = set() if instant else {n for n in key if key[n] in self.spacing.measured}
        grouped = grouped_template(template, [label])
        regex = "|".join(re.escape(v) for _, v in pools)
        matcher = f"{label}=~{escape_label_value(regex)}"
        if recorded:
            grouped = recorded_template(signal)
        if grouped is None:  # each pool read as `_fetch` / `_newest_gib` read it first
            lookbacks = {n: self._lookback_of(key[n], instant) for n in key}
            return None, [
                (key[n], build_query(template, {label: v}, lookbacks[n]), instant) for n, v in pools
            ]
        group: _Group | None = None
        # For the frame buffer, the group over metrics.staleness is built first: it is
        # the fallback of the one over the step's lookback.
        for lookback in reversed(self.memory_lookbacks) if instant else [self._lookback]:
            per_target = {
                n: build_query(
                    template, {label: v}, lookback if instant else self._lookback_of(key[n], False)
                )
                for n, v in pools
            }
            g = _Group(
                grouped.format(matchers=matcher, lookback=lookback),
                (label,),
                instant=instant,
                recorded=recorded,
            )
            g.targets = {(v,): (key[n], per_target[n]) for n, v in pools if n not in coarse}
            g.stale, group = group, g
        return group, [(key[n], per_target[n], instant) for n in sorted(coarse)]

    def _lookback_of(self, key: str, instant: bool) -> str:
        return self.memory_lookbacks[0] if instant else self.spacing.lookback(key)

    @property
    def _lookback(self) -> str:
        """The lookback of a series sampled at the step (one not found coarser)."""
        return lookback_ms(self.config.metrics.step, None)

    def _workload_queries(self) -> list[tuple[str, str]]:
        """Each workload's own query, as `_fetch` builds it (a serving-demand preset's
        template where one is set)."""
        default = self.config.prometheus.queries.workload_load
        return [
            (
                f"workload:{w.key}",
                build_workload_query(
                    w.demand.template if w.demand is not None else default,
                    w.namespace,
                    w.name,
                    self.spacing.lookback(f"workload:{w.key}"),
                ),
            )
            for w in self.config.workloads
        ]

    def _workload_group(self) -> _Group | None:
        if self.config.prometheus.queries.workload_load != DEFAULT_WORKLOAD_TEMPLATE:
            return None
        if not self.config.workloads:
            return None
        # One series per pair already: no `sum by` (a pair twice: `memo.split_answer`).
        g = _Group(f"last_over_time({WORKLOAD_RULE}[{self._lookback}])", ("namespace", "workload"))
        for w, (key, query) in zip(self.config.workloads, self._workload_queries(), strict=True):
            if w.demand is None and key not in self.spacing.measured:
                g.targets[(w.namespace, w.name)] = (key, query)
        return g

    # ------------------------------------------------------------------ fetching

    def _query(self, query: str, chunk: Chunk, counted: bool = True) -> list[Any] | SourceError:
        with self._count_lock:
            self.queries_last_tick += counted
        try:
            if chunk[1] == INSTANT:
                return fast_query(self.transport, query, chunk[0])
            return fast_query_range(
                self.transport, query, chunk[0], chunk[1], self.config.metrics.step
            )
        except SourceError as e:
            return e

    def prefetch(
        self, now: float, spans: Mapping[str, tuple[float, float]] | None = None, pieces: int = 1
    ) -> dict[AnswerKey, Answer]:
        """Every answer the tick's per-target reads will ask for, fetched concurrently:
        the grouped queries first, then, one by one, what they did not cover. With
        `spans`, only those ranges of those targets' series, each cut into `pieces`
        (the background backfill, `adapters/prometheus/backfill.py`)."""
        groups, single = self._groups()
        step = self.config.metrics.step
        span_of = spans.get if spans is not None else lambda key: self._start(key, now)
        answers: dict[AnswerKey, Answer] = {}
        jobs: list[tuple[str, Chunk, Callable[[Answer], None]]] = []
        instant = (math.floor(now / step) * step, INSTANT)
        resting = self.totals.resting(now) if spans is None else set()  # not on backfill
        for g in groups:
            if g.instant:
                members = [(v, query) for v, (k, query) in g.targets.items() if k not in resting]
                if spans is None and members:
                    jobs.append(
                        (g.query, instant, partial(split_answer, g.by, members, instant, answers))
                    )
                continue
            by_span: dict[tuple[float, float], list[tuple[tuple[str, ...], str]]] = {}
            for values, (key, query) in g.targets.items():
                span = span_of(key)
                if span is not None:
                    by_span.setdefault(span, []).append((values, query))
            for span, members in by_span.items():
                for chunk in chunks(*span, step, pieces):
                    store = partial(split_answer, g.by, members, chunk, answers)
                    if g.recorded and spans is None:  # not the backfill's older spans
                        store = partial(self._split_recorded, store, members, chunk, answers)
                    jobs.append((g.query, chunk, store))
        self._run(jobs, counted=spans is None)
        if spans is None:
            self._run(list(self._stale_jobs(groups, instant, answers)))
        uncovered = single + [(*t, g.instant) for g in groups for t in g.targets.values()]
        jobs = [
            (query, chunk, partial(answers.__setitem__, (query, *chunk)))
            for key, query, is_instant in uncovered
            if key not in resting
            for chunk in self._chunks(key, is_instant, span_of(key), instant, spans, pieces)
            if (query, *chunk) not in answers
        ]
        self._run(jobs, counted=spans is None)
        return answers

    def _check_rules(self, now: float) -> None:
        """Which pools Prometheus records (`rules.py`): one instant query, every
        `rules.CHECK_EVERY` seconds."""
        if not self.rules.needs_check(self.config, now):
            return
        step = self.config.metrics.step
        answer = self._query(check_query(), (math.floor(now / step) * step, INSTANT))
        self.rules.update(now, answer, self.config)

    def _split_recorded(
        self,
        split: Callable[[Answer], None],
        members: list[tuple[tuple[str, ...], str]],
        chunk: Chunk,
        answers: dict[AnswerKey, Answer],
        result: Answer,
    ) -> None:
        """A recorded series' answer: a pool it misses although it came (its rule removed,
        a gap) is read raw for now, and the rules are checked again (`rules.py`)."""
        split(result)
        if isinstance(result, list):
            self.rules.note_missing([q for _, q in members if (q, *chunk) not in answers])

    def _chunks(
        self,
        key: str,
        is_instant: bool,
        span: tuple[float, float] | None,
        instant: Chunk,
        spans: Mapping[str, tuple[float, float]] | None,
        pieces: int,
    ) -> list[Chunk]:
        if is_instant:
            return [instant] if spans is None else []
        return [] if span is None else chunks(*span, self.config.metrics.step, pieces)

    @staticmethod
    def _stale_jobs(
        groups: list[_Group], instant: Chunk, answers: dict[AnswerKey, Answer]
    ) -> Iterable[tuple[str, Chunk, Callable[[Answer], None]]]:
        """The frame-buffer groups' second tries, for the pools their first found empty."""
        for g in groups:
            if g.stale is None:
                continue
            empty = {v for v, (_, q) in g.targets.items() if answers.get((q, *instant)) == []}
            members = [(v, q) for v, (_, q) in g.stale.targets.items() if v in empty]
            if members:
                yield g.stale.query, instant, partial(split_answer, g.by, members, instant, answers)

    def _run(
        self, jobs: list[tuple[str, Chunk, Callable[[Answer], None]]], counted: bool = True
    ) -> None:
        """The queries, at most `prometheus.max_concurrent_queries` at a time; those of
        the background backfill are not counted in `queries_last_tick`."""
        if not jobs:
            return
        workers = min(self.config.prometheus.max_concurrent_queries, len(jobs))
        with ThreadPoolExecutor(workers, thread_name_prefix="prometheus") as pool:
            futures = [(pool.submit(self._query, q, c, counted), store) for q, c, store in jobs]
            for future, store in futures:
                store(future.result())

    def after_tick(self) -> None:
        """The first reads' backfill starts once the tick is done, so it does not slow
        the tick's forecast (a reader not told starts it at its next read)."""
        self.backfill.start()

    def close(self) -> None:
        self.backfill.close()

    def read(self, now: float) -> Metrics:
        # The rest of the windows joins at the next tick: a backfill still running (ticks
        # closer than it takes) is waited for, at most one request's timeout.
        self.backfill.wait(timeout=self.config.prometheus.timeout)
        self.backfill.apply(self.windows)
        self.backfill.start()
        self.queries_last_tick = 0
        self._check_rules(now)
        real, answers = self.transport, self.prefetch(now)
        ranges = [pair for g in self._groups()[0] if not g.instant for pair in g.targets.values()]
        self.steady = steady_reads(self.windows, ranges, answers, now, self.config)
        memo = MemoTransport(real, answers)
        self.transport = memo  # type: ignore[assignment]
        try:
            return super().read(now)
        finally:
            self.transport, self.steady = real, {}
            self.queries_last_tick += memo.fallbacks
