"""The Prometheus reader: one grouped read a tick (`plan.py`) on the `metrics.step` grid
into a window per target of its `forecast.fit_step` buckets (`window.py`).

A target's first read backfills its window (with `prometheus.background_backfill`, only
`forecast.min_history` plus `prometheus.overlap` now, the rest behind the tick:
`backfill.py`); later reads fetch only what is new, plus `overlap` for late samples.

Failure policy: any failure for a target (a failed query, a malformed answer, a NaN, Inf
or out-of-range sample) sets its `problem`, so the core takes no action on it and says
why; the reader's health records the last error; the next good fetch recovers by itself.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from gpuscaler.adapters.prometheus.backfill import Backfill, Folds, Pending
from gpuscaler.adapters.prometheus.fetch import Cuts, Fetcher, Job
from gpuscaler.adapters.prometheus.plan import (
    INSTANT,
    Answer,
    AnswerKey,
    Chunk,
    Plan,
    chunks,
    memory_lookbacks,
    plan_reads,
)
from gpuscaler.adapters.prometheus.promql import build_query, build_workload_query
from gpuscaler.adapters.prometheus.rules import PoolRules
from gpuscaler.adapters.prometheus.spacing import SpacingTracker
from gpuscaler.adapters.prometheus.transport import SourceError, Transport
from gpuscaler.adapters.prometheus.window import (
    LOAD,
    MEMORY_MIB,
    PERCENT,
    Window,
    decode_vector,
    drop_outside,
    one_series,
)
from gpuscaler.config import Config, ForecastConfig, NodePoolConfig, WorkloadConfig
from gpuscaler.core.model import FloatArray, Series
from gpuscaler.demand import DEMAND_BOUNDS

log = logging.getLogger("gpuscaler.prometheus")


@dataclass
class Health:
    ok: bool = True
    last_success: float | None = None


@dataclass
class Read:
    """What one target's read found: a NaN or Inf sample, the first out-of-range
    problem, any sample, and the times of the finite samples (their spacing is measured)."""

    had_bad: bool = False
    absurd: str | None = None
    got_any: bool = False
    times: list[FloatArray] = field(default_factory=list)


@dataclass(frozen=True)
class PoolMetrics:
    """What Prometheus says of one node pool this tick; the frame buffer in use is the
    fullest GPU's, the total as dcgm-exporter reports it, both in GiB."""

    name: str
    utilization: Series | None
    stall: Series | None
    memory_used_gib: float | None = None
    memory_total_gib: float | None = None
    problem: str | None = None
    unmatched: bool = False
    """The pool has no metrics_matchers: nothing was asked of Prometheus."""


@dataclass(frozen=True)
class WorkloadMetrics:
    key: str
    load: Series | None
    problem: str | None = None
    demand: Series | None = None
    """The workload's leading signal (workloads[].leading_query), when it names one."""
    demand_problem: str | None = None
    serving: tuple[float, str] | None = None
    """Per-replica target and unit when `load` is the serving stack's demand (its preset)."""


@dataclass(frozen=True)
class Metrics:
    """One tick's metrics, per configured pool and workload, in config order."""

    time: float
    pools: tuple[PoolMetrics, ...] = ()
    workloads: tuple[WorkloadMetrics, ...] = ()


@dataclass(frozen=True)
class Kept:
    gib: float
    read_at: float


class Totals:
    """Each pool's frame-buffer total (`pool:NAME:fb_total`), read every
    `prometheus.memory_total_every` (0: every tick), not every tick: a GPU's memory does not
    change, and its query is the costliest. Read again when none is kept, when due, or when
    the pool's memory in use is absent (its GPUs may have changed). A failed refresh keeps
    it up to `memory_total_every` + `metrics.staleness`; one that finds nothing forgets it."""

    def __init__(self, config: Config):
        self.kept: dict[str, Kept] = {}
        self._identity: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {}
        self.reconfigure(config)

    def due(self, key: str, now: float) -> bool:
        kept = self.kept.get(key)
        return kept is None or not 0 <= now - kept.read_at < self.every

    def kept_within_limit(self, key: str, now: float) -> float | None:
        kept = self.kept.get(key)
        return kept.gib if kept is not None and 0 <= now - kept.read_at <= self.limit else None

    def store(self, key: str, gib: float | None, now: float) -> None:
        if gib is None or self.every <= 0:
            self.kept.pop(key, None)
        else:
            self.kept[key] = Kept(gib, now)

    def reconfigure(self, config: Config) -> None:
        """Forget the totals of pools gone, or read with other matchers or template."""
        template = config.prometheus.queries.pool_memory_total
        identity = {
            f"pool:{p.name}:fb_total": (template, tuple(sorted(p.metrics_matchers.items())))
            for p in config.node_pools
            if p.metrics_matchers
        }
        self.kept = {k: v for k, v in self.kept.items() if identity.get(k) == self._identity.get(k)}
        self._identity = identity
        self.every = config.prometheus.memory_total_every
        self.limit = self.every + config.metrics.staleness

    def resting(self, now: float) -> set[str]:
        return {key for key in self.kept if not self.due(key, now)}


class PrometheusMetrics:
    """Metrics from Prometheus, fetched incrementally into a window per target; nothing
    of the cluster (`gpuscaler.sources` joins the two)."""

    name = "prometheus"

    def __init__(self, config: Config, transport: Transport | None = None):
        self.config = config
        self.fetcher = Fetcher(config, transport or Transport(config.prometheus))
        self.windows: dict[str, Window] = {}
        self.health = Health()
        self.spacing = SpacingTracker(config.metrics.step)
        self.totals = Totals(config)
        self.backfill = Backfill(self._backfill_fetch)
        self._head: tuple[Config, float, dict[str, float]] | None = None
        self._answers: dict[AnswerKey, Answer] = {}
        self._cuts: Cuts = {}
        self._errors: list[str] = []

    @property
    def transport(self) -> Transport:
        return self.fetcher.transport

    @property
    def rules(self) -> PoolRules:
        return self.fetcher.rules

    @property
    def queries_last_tick(self) -> int:
        """Queries sent by the last read (the background backfill's not counted)."""
        return self.fetcher.queries

    def close(self) -> None:
        self.backfill.close()
        self.fetcher.close()

    def after_tick(self) -> None:
        """The backfill starts once the tick is done, so it does not slow its forecast."""
        self.backfill.start()

    def reconfigure(self, config: Config) -> None:
        """Use `config` from the next tick: windows of targets no longer configured are
        dropped, all of them when the sampling grid changed."""
        if (config.metrics.step, config.metrics.window) != (
            self.config.metrics.step,
            self.config.metrics.window,
        ):
            self.windows.clear()
        transport = self.transport
        if config.prometheus != self.config.prometheus:
            transport = Transport(config.prometheus)
        keep = {f"pool:{p.name}:" for p in config.node_pools}
        keep |= {f"workload:{w.key}" for w in config.workloads}
        for key in list(self.windows):
            if not any(key == k or key.startswith(k) for k in keep):
                del self.windows[key]
        self.spacing.reset(config.metrics.step, lambda key: key in self.windows)
        self.totals.reconfigure(config)
        self.fetcher.reconfigure(config, transport)
        self.config = config

    def read(self, now: float) -> Metrics:
        """This tick's metrics of every configured pool and workload."""
        # A backfill still running (ticks closer than it takes) is waited for, at most
        # one request's timeout; what it found joins the windows now.
        self.backfill.wait(timeout=self.config.prometheus.timeout)
        self.backfill.apply(self.windows)
        self.backfill.start()
        self.fetcher.queries, self._errors = 0, []
        self.fetcher.check_rules(now)
        span = partial(self._span, now=now)
        resting = self.totals.resting(now)
        got = self.fetcher.prefetch(self._plan_now(), now, span, resting)
        self._answers, self._cuts = got.answers, got.cuts
        try:
            pools = tuple(self._pool_metrics(p, now) for p in self.config.node_pools)
            workloads = tuple(self._workload(w, now) for w in self.config.workloads)
        finally:
            self._answers, self._cuts = {}, {}
        self._record_health(now, self._errors)
        return Metrics(now, pools, workloads)

    def _workload(self, w: WorkloadConfig, now: float) -> WorkloadMetrics:
        template, bounds = self.config.prometheus.queries.workload_load, LOAD
        if w.demand is not None:  # the serving stack's own demand (gpuscaler.demand)
            template, bounds = w.demand.template, DEMAND_BOUNDS
        query = partial(build_workload_query, template, w.namespace, w.name)
        load, problem = self._fetch(f"workload:{w.key}", query, now, bounds)
        demand, demand_problem = None, None
        if w.leading_query:  # the workload's leading signal, sent as written
            leading = w.leading_query
            key = f"workload:{w.key}:demand"
            demand, demand_problem = self._fetch(key, lambda _: leading, now, DEMAND_BOUNDS)
        return WorkloadMetrics(
            w.key,
            load,
            problem,
            demand=demand,
            demand_problem=demand_problem,
            serving=(w.demand.per_replica, w.demand.unit_name) if w.demand else None,
        )

    def _pool_metrics(self, p: NodePoolConfig, now: float) -> PoolMetrics:
        if not p.metrics_matchers:
            why = "no metrics_matchers configured for this pool"
            return PoolMetrics(p.name, None, None, problem=why, unmatched=True)
        queries, m = self.config.prometheus.queries, p.metrics_matchers
        (util, util_problem), (stall, stall_problem) = (
            self._fetch(f"pool:{p.name}:{s}", partial(build_query, t, m), now, PERCENT)
            for s, t in (("util", queries.pool_utilization), ("stall", queries.pool_stall))
        )
        try:  # None when not exported within the staleness: the config alone bounds memory
            used_gib, used_problem = self._read_gib(queries.pool_memory_used, m, now)
        except SourceError as e:
            self._errors.append(f"pool:{p.name}:fb_used: {e}")
            used_gib, used_problem = None, str(e)
        total_gib, total_problem = self._total(p, used_gib is not None, now)
        problem = util_problem or stall_problem or used_problem or total_problem
        return PoolMetrics(p.name, util, stall, used_gib, total_gib, problem)

    def _fetch(
        self, key: str, query: Callable[[str], str], now: float, bounds: tuple[float, float]
    ) -> tuple[Series | None, str | None]:
        """The target's window after fetching what is new, and the problem if any. Values
        outside `bounds` (the metric's physical range) are invalid input, kept out of the
        window. `query` builds the PromQL for a lookback: a series found coarser than the
        step is read again at once with its own."""
        series, problem, read = self._fetch_once(
            key, query(self.spacing.lookback(key)), now, bounds
        )
        if (
            problem is None
            and series is not None
            and self.spacing.observe(key, partial(np.concatenate, [np.empty(0), *read.times]))
        ):
            self.windows.pop(key, None)  # backfill the window with the new lookback
            self.backfill.pending.pop(key, None)
            return self._fetch_once(key, query(self.spacing.lookback(key)), now, bounds)[:2]
        return series, problem

    def _fetch_once(
        self, key: str, query: str, now: float, bounds: tuple[float, float]
    ) -> tuple[Series | None, str | None, Read]:
        step, width = self.config.metrics.step, self._width(key)
        first, end = self._grid(now)
        window = self.windows.get(key)
        if window is None or window.fetched_until is None or window.width != width:
            # A first read starts afresh: what a failed or empty one left is read again.
            size = max(1, round(self.config.metrics.window / width))
            window = self.windows[key] = Window(step=step, width=width, size=size)
        window.advance(now)
        start = self._span(key, now)[0]
        if window.fetched_until is None and start > first:
            self.backfill.pending[key] = Pending(window, query, first, start, bounds)
        read = Read()
        try:
            self._read_span(read, window, query, start, end, bounds)
            if start > first and window.empty():
                # Nothing in a first read's head: the rest now, not behind, so that a
                # silent series is told stale (or absent) on this very tick.
                self.backfill.pending.pop(key, None)
                self._read_span(read, window, query, first, start, bounds)
        except SourceError as e:
            self._errors.append(f"{key}: {e}")
            return window.series(), str(e), read
        empty = not read.got_any and window.empty()
        if not empty:
            window.fetched_until = end  # an empty window is backfilled again next tick
            window.seal(end - self.config.prometheus.overlap)
        if read.absurd is not None:
            return window.series(), read.absurd, read
        if read.had_bad:
            return window.series(), "NaN or Inf in the newest samples", read
        if empty:
            return window.series(), "empty result: no series matches", read
        return window.series(), None, read

    def _read_span(
        self,
        read: Read,
        window: Window,
        query: str,
        start: float,
        end: float,
        bounds: tuple[float, float],
    ) -> None:
        """Samples from `start` to `end` into the window, in the chunks the tick's
        prefetch cut (else at most the point limit), noted in `read`."""
        step = self.config.metrics.step
        for chunk in self._cuts.get((query, start, end)) or chunks(start, end, step):
            times, values, bad = one_series(self._answer(query, chunk))
            values = values.copy()  # a grouped answer's series may serve several targets
            read.absurd = read.absurd or drop_outside(values, bounds)
            window.write(times, values)
            read.had_bad |= bad
            read.got_any |= times.size > 0
            read.times.append(times[np.isfinite(values)])

    def _answer(self, query: str, chunk: Chunk) -> list[Any]:
        """The tick's prefetched answer, else asked now (and counted)."""
        found = self._answers.get((query, *chunk))
        if found is None:
            found = self.fetcher.ask(query, chunk)
        if isinstance(found, SourceError):
            raise found
        return found

    def _grid(self, now: float) -> tuple[float, float]:
        """(first, end): the window's first and last point on the step grid."""
        step = self.config.metrics.step
        end = math.floor(now / step) * step
        return end - step * (round(self.config.metrics.window / step) - 1), end

    def _span(self, key: str, now: float) -> tuple[float, float]:
        """(start, end) the tick reads of `key`'s series: what is new since its last read
        (plus `overlap`), or a first read's head: `forecast.min_history` (the longest any
        target asks for) plus `overlap` and one bucket of the widest `fit_step` (the
        forecaster counts whole buckets), unless `background_backfill` is off."""
        first, end = self._grid(now)
        window = self.windows.get(key)
        if window is None or window.fetched_until is None:
            if not self.config.prometheus.background_backfill:
                return first, end
            return max(first, end - self._sections()[1]), end
        return max(first, window.fetched_until - self.config.prometheus.overlap), end

    def _width(self, key: str) -> float:
        """`key`'s bucket width: its target's `forecast.fit_step`, no finer than the step."""
        width = self._sections()[2].get(key, self.config.forecast.fit_step)
        return max(width, self.config.metrics.step)

    def _sections(self) -> tuple[Config, float, dict[str, float]]:
        """(config, head length, fit_step by window key), resolved once per config."""
        if self._head is None or self._head[0] is not self.config:
            c = self.config
            pools = {
                p.name: c.pool_section(p.name, "forecast", ForecastConfig) for p in c.node_pools
            }
            loads = {
                w.key: c.workload_section(w.key, "forecast", ForecastConfig) for w in c.workloads
            }
            longest = max(f.min_history for f in [c.forecast, *pools.values(), *loads.values()])
            widths = {
                f"pool:{n}:{s}": f.fit_step for n, f in pools.items() for s in ("util", "stall")
            }
            widths |= {f"workload:{k}": f.fit_step for k, f in loads.items()}
            widths |= {f"workload:{k}:demand": f.fit_step for k, f in loads.items()}
            widest = max([c.forecast.fit_step, *widths.values()])
            self._head = (c, longest + c.prometheus.overlap + widest, widths)
        return self._head

    def _read_gib(
        self, template: str, matchers: Mapping[str, str], now: float
    ) -> tuple[float | None, str | None]:
        """The newest frame-buffer figure in GiB: an instant query at the grid's end over
        the step's lookback, and only when that finds nothing again over
        `metrics.staleness` (Prometheus' cost grows with the lookback); failures raised."""
        at = self._grid(now)[1]
        value: float | None = None
        bad = False
        for lookback in memory_lookbacks(self.config):
            query = build_query(template, matchers, lookback)
            value, bad = decode_vector(self._answer(query, (at, INSTANT)))
            if value is not None or bad:
                break
        if bad:
            return None, "NaN or Inf in the newest samples"
        if value is None:
            return None, None
        absurd = drop_outside(np.array([value]), MEMORY_MIB)
        return (None, absurd) if absurd else (value / 1024, None)

    def _total(self, p: NodePoolConfig, used: bool, now: float) -> tuple[float | None, str | None]:
        """The pool's frame-buffer total: the kept one while it is not due and the pool's
        used figure is present (else its GPUs may have changed), else read (`Totals`)."""
        key, totals = f"pool:{p.name}:fb_total", self.totals
        if used and not totals.due(key, now):
            return totals.kept[key].gib, None
        try:
            gib, problem = self._read_gib(
                self.config.prometheus.queries.pool_memory_total, p.metrics_matchers, now
            )
        except SourceError as e:
            self._errors.append(f"{key}: {e}")
            kept = totals.kept_within_limit(key, now) if used else None
            return (kept, None) if kept is not None else (None, str(e))
        totals.store(key, gib, now)
        return gib, problem

    def _plan_now(self) -> Plan:
        return plan_reads(self.config, self.spacing.measured, self.rules)

    def _backfill_fetch(self, batch: Mapping[str, Pending]) -> Folds:
        """What the first reads left out: by the grouped queries, then one by one, each
        answer folded into its target's buckets as it arrives."""
        folds = Folds(batch)
        spans = {k: (p.start, p.end) for k, p in batch.items()}
        end = max(p.end for p in batch.values())
        pieces = self.config.prometheus.max_concurrent_queries
        plan, fetcher, step = self._plan_now(), self.fetcher, self.config.metrics.step
        got = fetcher.prefetch(
            plan, end, spans.get, set(), backfill=True, pieces=pieces, sink=folds.take
        )
        jobs: list[Job] = [
            (p.query, chunk, partial(folds.take, (p.query, *chunk)))
            for p in batch.values()
            for chunk in got.cuts.get((p.query, p.start, p.end))
            or chunks(p.start, p.end, step, pieces)
            if (p.query, *chunk) not in folds.seen
        ]
        fetcher.run(jobs, counted=False)
        return folds

    def _record_health(self, now: float, errors: list[str]) -> None:
        if errors:
            self.health.ok = False
            log.warning(
                "prometheus: %d target(s) failed: %s",
                len(errors),
                errors[0],
                extra={"event": "source_unhealthy", "source": "prometheus"},
            )
        else:
            if not self.health.ok:
                log.info("prometheus recovered", extra={"event": "source_recovered"})
            self.health.ok = True
            self.health.last_success = now
