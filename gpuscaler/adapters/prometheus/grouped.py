"""Grouped, concurrent Prometheus reads (issue 18): a tick's queries no longer grow with
the number of targets.

`GroupedPrometheusMetrics` is a `PrometheusMetrics` that, before the tick's per-target
reads, fetches what they would fetch in few queries, run concurrently, and answers the
per-target reads from memory:
- **pools**: pools whose `metrics_matchers` are one equality on the same label (a "pool
  family", e.g. `modelName`) share one query per signal:
  `avg by (modelName) (last_over_time(DCGM_FI_DEV_GPU_UTIL{modelName=~"A|B"}[1s]))`;
  each series answers the pool with that label value;
- **workloads**: one query over the recording rule `gpuscaler:workload_gpu_utilization:sum`
  (deploy/prometheus/prometheusrule.yaml), which sums GPU utilization by (namespace,
  workload) with the workload taken from the pod's name (Deployment
  `<name>-<hash>-<id>`, StatefulSet `<name>-<ordinal>`, either pod label convention);
- a target whose matchers or template do not fit a group, or that the grouped answer
  does not cover (the rule not installed, a workload named unlike its pods), is read with
  its own per-target query, still concurrently, so the grouped form never loses a target.

The window arithmetic (what is new since the last tick, chunks under 11,000 points) stays
`PrometheusMetrics._fetch`'s: the chunks are computed the same way here, and each answer is
handed to `_fetch` keyed by (query, start, end). Answers are decoded by orjson and numpy
(`decode_fast`), not by `json` and a Python loop per point.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import orjson
from prometheus_api_client.exceptions import PrometheusApiClientException

from gpuscaler.adapters.prometheus.promql import (
    HOSTNAME_LABELS,
    build_query,
    build_workload_query,
    escape_label_value,
    format_step,
)
from gpuscaler.adapters.prometheus.source import MAX_POINTS, Metrics, PrometheusMetrics
from gpuscaler.adapters.prometheus.spacing import lookback_ms
from gpuscaler.adapters.prometheus.transport import SourceError, Transport
from gpuscaler.config import NodePoolConfig

WORKLOAD_RULE = "gpuscaler:workload_gpu_utilization:sum"
"""Recorded by deploy/prometheus/prometheusrule.yaml: GPU utilization summed by
(namespace, workload)."""
DEFAULT_WORKLOAD_TEMPLATE = "sum(last_over_time(DCGM_FI_DEV_GPU_UTIL{{{matchers}}}[{lookback}]))"
"""The per-target workload query the rule stands for; a custom template is read per
target, since the rule cannot know what it computes."""
_AGGREGATE = re.compile(r"^\s*(avg|sum|max|min)\s*\((.*)\)\s*$", re.S)

Chunk = tuple[int, int]
AnswerKey = tuple[str, int, int]
Answer = list[Any] | SourceError
"""A query's `data.result`, or the error it failed with (raised when `_fetch` asks)."""


@dataclass
class _Group:
    """One grouped query and the targets it answers: label values -> (key, query)."""

    query: str
    by: tuple[str, ...]
    targets: dict[tuple[str, ...], tuple[str, str]] = field(default_factory=dict)


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

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def fast_query_range(
    transport: Transport, query: str, start: float, end: float, step: float
) -> list[Any]:
    """`Transport.query_range` (same auth, TLS, retries and error translation), with the
    answer decoded by orjson and each series' points turned into numpy arrays at once."""
    api = transport.client

    def request() -> Any:
        answer = api._session.get(
            f"{api.url}/api/v1/query_range",
            params={
                "query": query,
                "start": round(start),  # as custom_query_range sends them
                "end": round(end),
                "step": format_step(step),
            },
            verify=api._session.verify,
            headers=api.headers,
            auth=api.auth,
            cert=api._session.cert,
            timeout=api._timeout,
        )
        if answer.status_code != 200:
            raise PrometheusApiClientException(
                f"HTTP Status Code {answer.status_code} ({answer.content[:200]!r})"
            )
        return orjson.loads(answer.content)["data"]["result"]

    return decode_fast(transport._call(request))


def decode_fast(result: Any) -> list[Any]:
    """Each series' `values` as (times, values) float arrays under `arrays`, which
    `prometheus.decode_matrix` takes as they are; a malformed answer is left for it to
    refuse with its own message."""
    if not isinstance(result, list):
        return result  # type: ignore[no-any-return]
    for item in result:
        values = item.get("values") if isinstance(item, dict) else None
        if not isinstance(values, list):
            continue
        try:
            pairs = np.array(values, dtype=object).reshape(len(values), 2)
            item["arrays"] = (pairs[:, 0].astype(np.float64), pairs[:, 1].astype(np.float64))
        except (ValueError, TypeError):
            continue
    return result


def chunks(start: float, end: float, step: float) -> list[Chunk]:
    """The (start, end) pairs `PrometheusMetrics._fetch` asks for, in whole seconds."""
    out, size, last = [], math.floor(MAX_POINTS * step), math.floor(end)
    t = math.floor(start)
    while True:
        chunk_end = min(last, t + size)
        out.append((t, chunk_end))
        if chunk_end >= last:
            return out
        t = chunk_end


def grouped_template(template: str, by: Iterable[str]) -> str | None:
    """`avg(X)` -> `avg by (L) (X)`; None when the template is not one aggregation."""
    m = _AGGREGATE.match(template)
    if m is None or "{matchers}" not in m.group(2) or not _balanced(m.group(2)):
        return None
    return f"{m.group(1)} by ({', '.join(by)}) ({m.group(2)})"


def _balanced(inner: str) -> bool:
    """The aggregation's own parentheses enclose all of `inner` (not `avg(a) / avg(b)`)."""
    depth = 0
    for ch in inner:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


class GroupedPrometheusMetrics(PrometheusMetrics):
    """Prometheus metrics read by a few grouped queries a tick, concurrently."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.queries_last_tick = 0
        self._count_lock = threading.Lock()

    # ------------------------------------------------------------------ planning

    def _start(self, key: str, now: float) -> tuple[float, float]:
        """(start, end) `_fetch` will ask for `key` this tick."""
        step = self.config.metrics.step
        size = round(self.config.metrics.window / step)
        end = math.floor(now / step) * step
        first = end - step * (size - 1)
        window = self.windows.get(key)
        if window is None or window.fetched_until is None:
            return first, end
        return max(first, window.fetched_until - self.config.prometheus.overlap), end

    def _groups(self) -> tuple[list[_Group], list[tuple[str, str]]]:
        """Grouped queries, and the (key, query) pairs that must be read one by one."""
        q = self.config.prometheus.queries
        signals = [
            ("util", q.pool_utilization),
            ("stall", q.pool_stall),
            ("fb_used", q.pool_memory_used),
            ("fb_total", q.pool_memory_total),
        ]
        families: dict[str, list[tuple[str, str]]] = {}
        single: list[tuple[str, str]] = []
        for p in self.config.node_pools:
            if not p.metrics_matchers:
                continue
            (label, value), *more = p.metrics_matchers.items()
            if more or label in HOSTNAME_LABELS:
                single += [
                    (f"pool:{p.name}:{s}", self._query_for(f"pool:{p.name}:{s}", t, p))
                    for s, t in signals
                ]
            else:
                families.setdefault(label, []).append((p.name, value))
        groups = []
        for label, pools in families.items():
            regex = "|".join(re.escape(v) for _, v in pools)
            for signal, template in signals:
                grouped = grouped_template(template, [label])
                per_target = {
                    name: build_query(
                        template, {label: value}, self.spacing.lookback(f"pool:{name}:{signal}")
                    )
                    for name, value in pools
                }
                # A series sampled coarser than the step (adapters/prometheus/spacing.py)
                # needs its own lookback: it is read on its own.
                coarse = {n for n, _ in pools if f"pool:{n}:{signal}" in self.spacing.measured}
                single += [(f"pool:{n}:{signal}", per_target[n]) for n in sorted(coarse)]
                if grouped is None:
                    single += [
                        (f"pool:{n}:{signal}", per_target[n]) for n, _ in pools if n not in coarse
                    ]
                    continue
                matcher = f"{label}=~{escape_label_value(regex)}"
                g = _Group(grouped.format(matchers=matcher, lookback=self._lookback), (label,))
                for name, value in pools:
                    if name not in coarse:
                        g.targets[(value,)] = (f"pool:{name}:{signal}", per_target[name])
                groups.append(g)
        workload = self._workload_group()
        if workload is not None:
            groups.append(workload)
            covered = {key for key, _ in workload.targets.values()}
            single += [t for t in self._workload_queries() if t[0] not in covered]
        else:
            single += self._workload_queries()
        return groups, single

    @property
    def _lookback(self) -> str:
        """The lookback of a series sampled at the step (one not found coarser)."""
        return lookback_ms(self.config.metrics.step, None)

    def _query_for(self, key: str, template: str, p: NodePoolConfig) -> str:
        return build_query(template, p.metrics_matchers, self.spacing.lookback(key))

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
        g = _Group(
            f"sum by (namespace, workload) (last_over_time({WORKLOAD_RULE}[{self._lookback}]))",
            ("namespace", "workload"),
        )
        for w, (key, query) in zip(self.config.workloads, self._workload_queries(), strict=True):
            if w.demand is None and key not in self.spacing.measured:
                g.targets[(w.namespace, w.name)] = (key, query)
        return g

    # ------------------------------------------------------------------ fetching

    def _query(self, query: str, chunk: Chunk) -> list[Any] | SourceError:
        with self._count_lock:
            self.queries_last_tick += 1
        try:
            return fast_query_range(
                self.transport, query, chunk[0], chunk[1], self.config.metrics.step
            )
        except SourceError as e:
            return e

    def prefetch(self, now: float) -> dict[AnswerKey, Answer]:
        """Every answer the tick's per-target reads will ask for, fetched concurrently:
        the grouped queries first, then, one by one, what they did not cover."""
        groups, single = self._groups()
        step = self.config.metrics.step
        answers: dict[AnswerKey, Answer] = {}
        jobs: list[tuple[str, Chunk, Callable[[Answer], None]]] = []
        for g in groups:
            by_span: dict[tuple[float, float], list[tuple[tuple[str, ...], str]]] = {}
            for values, (key, query) in g.targets.items():
                by_span.setdefault(self._start(key, now), []).append((values, query))
            for span, members in by_span.items():
                for chunk in chunks(*span, step):
                    jobs.append((g.query, chunk, partial(_split, g.by, members, chunk, answers)))
        self._run(jobs)
        uncovered = single + [t for g in groups for t in g.targets.values()]
        jobs = [
            (query, chunk, partial(answers.__setitem__, (query, *chunk)))
            for key, query in uncovered
            for chunk in chunks(*self._start(key, now), step)
            if (query, *chunk) not in answers
        ]
        self._run(jobs)
        return answers

    def _run(self, jobs: list[tuple[str, Chunk, Callable[[Answer], None]]]) -> None:
        """The queries, at most `prometheus.max_concurrent_queries` at a time."""
        if not jobs:
            return
        workers = min(self.config.prometheus.max_concurrent_queries, len(jobs))
        with ThreadPoolExecutor(workers, thread_name_prefix="prometheus") as pool:
            futures = [(pool.submit(self._query, q, c), store) for q, c, store in jobs]
            for future, store in futures:
                store(future.result())

    def read(self, now: float) -> Metrics:
        self.queries_last_tick = 0
        real = self.transport
        answers = self.prefetch(now)
        memo = MemoTransport(real, answers)
        self.transport = memo  # type: ignore[assignment]
        try:
            return super().read(now)
        finally:
            self.transport = real
            self.queries_last_tick += memo.fallbacks


def _split(
    by: tuple[str, ...],
    members: list[tuple[tuple[str, ...], str]],
    chunk: Chunk,
    answers: dict[AnswerKey, Answer],
    result: Answer,
) -> None:
    """One grouped answer cut into the per-target answers it holds; a failed one stores
    nothing, so each target is asked on its own."""
    if isinstance(result, SourceError) or not isinstance(result, list):
        return
    by_values = {}
    for item in result:
        metric = (item.get("metric") or {}) if isinstance(item, dict) else {}
        by_values[tuple(str(metric.get(label, "")) for label in by)] = item
    for values, query in members:
        item = by_values.get(values)
        if item is not None:
            answers[(query, *chunk)] = [item]
