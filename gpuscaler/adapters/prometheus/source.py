"""The source: per target, the first cycle backfills in chunks under Prometheus'
11,000-points-per-series limit, later cycles fetch only what is new (plus a small overlap
for late samples); memory is window x targets.

Failure policy: any failure for a target sets its `problem`, so the core takes no action
on it and says why; the source's health records the last error; the next good fetch
recovers by itself.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

import numpy as np

from gpuscaler.adapters.prometheus.promql import build_query, build_workload_query
from gpuscaler.adapters.prometheus.spacing import SpacingTracker, lookback_ms
from gpuscaler.adapters.prometheus.total import Totals
from gpuscaler.adapters.prometheus.transport import SourceError, Transport
from gpuscaler.adapters.prometheus.window import (
    LOAD,
    MEMORY_MIB,
    PERCENT,
    Window,
    decode_matrix,
    decode_vector,
    drop_outside,
    out_of_range,
)
from gpuscaler.config import Config, NodePoolConfig, WorkloadConfig
from gpuscaler.core.model import FloatArray, Series
from gpuscaler.demand import DEMAND_BOUNDS

log = logging.getLogger("gpuscaler.prometheus")

MAX_POINTS = 10_000
"""Points per series per request: below Prometheus' hard limit of 11,000."""


@dataclass
class Health:
    ok: bool = True
    last_success: float | None = None
    failures: int = 0


@dataclass(frozen=True)
class PoolMetrics:
    """What Prometheus says of one node pool this tick."""

    name: str
    utilization: Series | None
    stall: Series | None
    memory_used_gib: float | None = None
    """Frame buffer in use on the pool's fullest GPU, newest sample."""
    memory_total_gib: float | None = None
    """Frame buffer of the pool's GPUs as dcgm-exporter reports it, newest sample."""
    problem: str | None = None
    """Why the metrics cannot be trusted this tick (a query failed, absurd values...)."""
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
class Steady:
    """One target's steady read done with others at once (`bulk.py`): `_fetch_once`
    takes it in place of advancing the window and reading."""

    query: str
    bounds: tuple[float, float]
    end: float
    values: FloatArray
    """The window's values after the read (a row of this tick's targets x time array)."""
    had_bad: bool
    absurd: str | None
    got_any: bool


def _present_times(series: Series) -> FloatArray:
    """Times of the window's samples (measured by the spacing tracker only every few
    reads: not computed for the others)."""
    present = np.flatnonzero(np.isfinite(series.values)).astype(np.float64)
    return series.start + series.step * present


class PrometheusMetrics:
    """Metrics from Prometheus, fetched incrementally into a window per target; nothing
    of the cluster (`gpuscaler.sources` joins the two)."""

    name = "prometheus"

    def __init__(self, config: Config, transport: Transport | None = None):
        self.config = config
        self.transport = transport or Transport(config.prometheus)
        self.windows: dict[str, Window] = {}
        self.health = Health()
        self._transport_errors: list[str] = []
        self.spacing = SpacingTracker(config.metrics.step)
        """Series read more coarsely than metrics.step, and their lookback."""
        self.sample_spacing = self.spacing.measured
        self.steady: dict[str, Steady] = {}
        """This tick's steady reads done at once, by key (`bulk.py`); taken by `_fetch_once`."""
        self.totals = Totals(config)
        """The pools' frame-buffer totals, read every few minutes (`total.py`)."""

    def _fetch(
        self, key: str, query: Callable[[str], str], now: float, bounds: tuple[float, float]
    ) -> tuple[Series | None, str | None]:
        """The target's window after fetching what is new, and the problem if any; a
        transport failure is also recorded for the source's health. Values outside
        `bounds` (the metric's physical range) are invalid input: kept out of the window,
        and the target gets no action this tick. `query` builds the PromQL for a lookback:
        a series found coarser than the step is read again at once with its own."""
        series, problem = self._fetch_once(key, query(self.spacing.lookback(key)), now, bounds)
        if (
            problem is None
            and series is not None
            and self.spacing.observe(key, partial(_present_times, series))
        ):
            self.windows.pop(key, None)  # backfill the window with the new lookback
            return self._fetch_once(key, query(self.spacing.lookback(key)), now, bounds)
        return series, problem

    def _fetch_once(
        self, key: str, query: str, now: float, bounds: tuple[float, float]
    ) -> tuple[Series | None, str | None]:
        step = self.config.metrics.step
        size = round(self.config.metrics.window / step)
        window = self.windows.setdefault(key, Window(step=step, size=size))
        end = math.floor(now / step) * step
        done = self.steady.pop(key, None)
        if done is not None and (done.query, done.bounds, done.end) != (query, bounds, end):
            done = None
        if done is None:
            window.advance(end)
        first = end - step * (size - 1)
        if window.fetched_until is not None:
            start = max(first, window.fetched_until - self.config.prometheus.overlap)
        else:
            start = self._first_start(key, query, first, end, bounds)
        try:
            if done is None:
                had_bad, absurd, got_any = self._read_span(window, query, start, end, bounds)
            else:
                window.values, window.end = done.values, done.end
                had_bad, absurd, got_any = done.had_bad, done.absurd, done.got_any
            if start > first and window.empty():
                # Nothing in a first read's head: the rest now, not behind, so that a
                # silent series is told stale (or absent) on this very tick.
                self._first_start_done(key)
                more = self._read_span(window, query, first, start, bounds)
                had_bad, absurd, got_any = had_bad or more[0], absurd or more[1], got_any or more[2]
        except SourceError as e:
            self._transport_errors.append(f"{key}: {e}")
            return window.series(), str(e)
        empty = not got_any and window.empty()  # a sample read means not empty
        if not empty:
            window.fetched_until = end  # an empty window is backfilled again next tick
        if absurd is not None:
            return window.series(), absurd
        if had_bad:
            return window.series(), "NaN or Inf in the newest samples"
        if empty:
            return window.series(), "empty result: no series matches"
        return window.series(), None

    def _read_span(
        self, window: Window, query: str, start: float, end: float, bounds: tuple[float, float]
    ) -> tuple[bool, str | None, bool]:
        """Samples from `start` to `end` into the window, in chunks under the points
        limit: (had NaN/Inf, the first out-of-range problem, got any sample)."""
        step = self.config.metrics.step
        had_bad = False
        absurd: str | None = None
        got_any = False
        chunk = math.floor(MAX_POINTS * step)
        last = math.floor(end)  # the client sends whole seconds
        t = math.floor(start)
        while True:
            chunk_end = min(last, t + chunk)
            times, values, bad = decode_matrix(
                self.transport.query_range(query, t, chunk_end, step)
            )
            problem = drop_outside(values, bounds)  # decoded: non-finite values are NaN
            absurd = absurd or problem
            window.write(times, values)
            had_bad |= bad
            got_any |= times.size > 0
            if chunk_end >= last:
                return had_bad, absurd, got_any
            t = chunk_end  # chunks share their edge sample: none is skipped

    def _first_start(
        self, key: str, query: str, first: float, end: float, bounds: tuple[float, float]
    ) -> float:
        """Where a window's first read starts: the whole window here (a reader that
        backfills in the background starts later and fetches the rest behind)."""
        return first

    def _first_start_done(self, key: str) -> None:
        """The rest of `key`'s window was read at once: nothing to read behind."""

    def _newest_gib(
        self, key: str, template: str, matchers: Mapping[str, str], now: float
    ) -> tuple[float | None, str | None]:
        """Newest frame-buffer figure in GiB, None when dcgm-exporter does not export it
        (or not within `metrics.staleness`): memory then bounds fragments by the config
        alone. A failing query is still a problem.

        Only the newest figure is used, so no window is kept (issue 18): an instant query
        at the grid's end over the step's lookback, and only when that finds nothing (a
        scrape interval longer than the step, a lagging scrape) again over
        `metrics.staleness`. Prometheus' cost grows with the samples in the lookback, so
        each is cheap where it is used."""
        try:
            return self._read_gib(template, matchers, now)
        except SourceError as e:
            self._transport_errors.append(f"{key}: {e}")
            return None, str(e)

    def _read_gib(
        self, template: str, matchers: Mapping[str, str], now: float
    ) -> tuple[float | None, str | None]:
        """`_newest_gib` without its handling of a failed query (raised)."""
        step = self.config.metrics.step
        at = math.floor(now / step) * step
        value: float | None = None
        bad = False
        for lookback in self.memory_lookbacks:
            query = build_query(template, matchers, lookback)
            value, bad = decode_vector(self.transport.query(query, at))
            if value is not None or bad:
                break
        if bad:
            return None, "NaN or Inf in the newest samples"
        if value is None:
            return None, None
        absurd = out_of_range(np.array([value]), MEMORY_MIB)
        return (None, absurd) if absurd else (value / 1024, None)

    @property
    def memory_lookbacks(self) -> tuple[str, str]:
        """The frame-buffer queries' lookbacks: that of a series sampled at the step,
        then `metrics.staleness` (a GPU's figure counts while fresher than that)."""
        stale = f"{max(1, math.ceil(self.config.metrics.staleness * 1000))}ms"
        return lookback_ms(self.config.metrics.step, None), stale

    def reconfigure(self, config: Config) -> None:
        """Use `config` from the next tick: windows of targets no longer configured are
        dropped, all of them when the sampling grid changed."""
        if (config.metrics.step, config.metrics.window) != (
            self.config.metrics.step,
            self.config.metrics.window,
        ):
            self.windows.clear()
        if config.prometheus != self.config.prometheus:
            self.transport = Transport(config.prometheus)
        keep = {f"pool:{p.name}:" for p in config.node_pools}
        keep |= {f"workload:{w.key}" for w in config.workloads}
        for key in list(self.windows):
            if not any(key == k or key.startswith(k) for k in keep):
                del self.windows[key]
        self.spacing.reset(config.metrics.step, lambda key: key in self.windows)
        self.totals.reconfigure(config)
        self.config = config

    def read(self, now: float) -> Metrics:
        """This tick's metrics of every configured pool and workload."""
        self._transport_errors = []
        pools = tuple(self._pool(p, now) for p in self.config.node_pools)
        queries = self.config.prometheus.queries
        workloads = []
        for w in self.config.workloads:
            template, bounds = queries.workload_load, LOAD
            if w.demand is not None:  # the serving stack's own demand (gpuscaler.demand)
                template, bounds = w.demand.template, DEMAND_BOUNDS
            key = w.key
            load, problem = self._fetch(
                f"workload:{key}",
                partial(build_workload_query, template, w.namespace, w.name),
                now,
                bounds,
            )
            demand, demand_problem = self._leading(w, now)
            workloads.append(
                WorkloadMetrics(
                    key,
                    load,
                    problem,
                    demand=demand,
                    demand_problem=demand_problem,
                    serving=(w.demand.per_replica, w.demand.unit_name) if w.demand else None,
                )
            )
        self._record_health(now, self._transport_errors)
        return Metrics(now, pools, tuple(workloads))

    def _pool(self, p: NodePoolConfig, now: float) -> PoolMetrics:
        if not p.metrics_matchers:
            return PoolMetrics(
                p.name,
                None,
                None,
                problem="no metrics_matchers configured for this pool",
                unmatched=True,
            )
        queries = self.config.prometheus.queries
        m = p.metrics_matchers
        util, util_problem = self._fetch(
            f"pool:{p.name}:util", partial(build_query, queries.pool_utilization, m), now, PERCENT
        )
        stall, stall_problem = self._fetch(
            f"pool:{p.name}:stall", partial(build_query, queries.pool_stall, m), now, PERCENT
        )
        used_gib, used_problem = self._newest_gib(
            f"pool:{p.name}:fb_used", queries.pool_memory_used, p.metrics_matchers, now
        )
        total_gib, total_problem = self._total(p, used_gib is not None, now)
        problem = util_problem or stall_problem or used_problem or total_problem
        return PoolMetrics(p.name, util, stall, used_gib, total_gib, problem)

    def _total(self, p: NodePoolConfig, used: bool, now: float) -> tuple[float | None, str | None]:
        """The pool's frame-buffer total: the kept one while it is not due and the
        pool's used figure is present this tick, else read (`total.py`)."""
        key, totals = f"pool:{p.name}:fb_total", self.totals
        # Without a used figure the pool's GPUs report nothing (those that come back may
        # be other GPUs): the total is read as before, and what it finds replaces the kept.
        if used and not totals.due(key, now):
            return totals.kept[key].gib, None
        try:
            gib, problem = self._read_gib(
                self.config.prometheus.queries.pool_memory_total, p.metrics_matchers, now
            )
        except SourceError as e:
            self._transport_errors.append(f"{key}: {e}")
            kept = totals.kept_within_limit(key, now) if used else None
            return (kept, None) if kept is not None else (None, str(e))
        totals.store(key, gib, now)
        return gib, problem

    def _leading(self, w: WorkloadConfig, now: float) -> tuple[Series | None, str | None]:
        """The workload's leading signal (workloads[].leading_query, sent as written)."""
        if not w.leading_query:
            return None, None
        query = w.leading_query
        return self._fetch(f"workload:{w.key}:demand", lambda _lookback: query, now, DEMAND_BOUNDS)

    def _record_health(self, now: float, errors: list[str]) -> None:
        if errors:
            self.health.ok = False
            self.health.failures += 1
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
