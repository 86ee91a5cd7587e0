"""Prometheus history for `gpuscaler whatif`: each workload's request rate, GPU load and
the replica counts the cluster ran, over a past range, through the controller's transport,
decoder and chunks.

Replica counts come from kube-state-metrics: the HPA's
`kube_horizontalpodautoscaler_status_current_replicas` (a ScaledObject's is KEDA's
`keda-hpa-<name>`), else `kube_deployment_status_replicas`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from gpuscaler.adapters.prometheus.plan import chunks
from gpuscaler.adapters.prometheus.promql import build_workload_query, escape_label_value
from gpuscaler.adapters.prometheus.spacing import lookback_ms
from gpuscaler.adapters.prometheus.transport import SourceError, Transport
from gpuscaler.adapters.prometheus.window import LOAD, decode_matrix, drop_outside
from gpuscaler.config import Config, WorkloadConfig, redact_url
from gpuscaler.core.history import Signal, WorkloadHistory
from gpuscaler.core.model import Series
from gpuscaler.errors import InputError

REQUESTS = (0.0, 1e9)
"""Requests per second: never negative, never a billion."""
REPLICAS = (0.0, 1e6)

HPA_REPLICAS = "max(kube_horizontalpodautoscaler_status_current_replicas{{{matchers}}})"
DEPLOYMENT_REPLICAS = "max(kube_deployment_status_replicas{{{matchers}}})"

Progress = Callable[[int], None]
"""Called with the number of range requests just made."""
READERS = 2
"""Workloads read at once, each on its own connection: while Prometheus evaluates one's
range, the other's answer is decoded."""


class HistoryError(InputError):
    """The history cannot be read at all (Prometheus unreachable, nothing configured)."""


def hpa_name(workload: WorkloadConfig) -> str:
    return f"keda-hpa-{workload.name}" if workload.kind == "ScaledObject" else workload.name


def replica_queries(workload: WorkloadConfig) -> list[tuple[str, str]]:
    """(signal name, query) for the replicas that ran, in the order tried."""
    ns = f"namespace={escape_label_value(workload.namespace)}"
    hpa = f"{ns},horizontalpodautoscaler={escape_label_value(hpa_name(workload))}"
    deploy = f"{ns},deployment={escape_label_value(workload.name)}"
    return [
        ("kube_horizontalpodautoscaler_status_current_replicas", HPA_REPLICAS.format(matchers=hpa)),
        ("kube_deployment_status_replicas", DEPLOYMENT_REPLICAS.format(matchers=deploy)),
    ]


def request_template(
    workload: WorkloadConfig, config: Config
) -> tuple[str | None, str, str | None]:
    """(template of the workload's request rate, its name, why there is none):
    `prometheus.queries.workload_requests`, else its `demand` when that is a rate (a
    queue preset counts requests inside the server, not arrivals)."""
    template = config.prometheus.queries.workload_requests
    if template is not None:
        return template, "workload_requests", None
    demand = workload.demand
    if demand is None:
        return None, "workload_requests", "prometheus.queries.workload_requests is not set"
    if demand.preset == "triton_rate" or demand.unit_name.endswith("/s"):
        return demand.template, f"demand ({demand.preset})", None
    return (
        None,
        f"demand ({demand.preset})",
        f"the workload's demand ({demand.preset}: {demand.unit_name}) counts requests in "
        "the server, not arrivals per second, and prometheus.queries.workload_requests "
        "is not set",
    )


class HistoryReader:
    """Range reads from the configured Prometheus."""

    def __init__(
        self, config: Config, transport: Transport | None = None, progress: Progress | None = None
    ):
        if config.prometheus.url is None:
            raise HistoryError("prometheus.url is not set in the config: whatif reads history")
        self.config = config
        self.shared = transport is not None
        """A transport given is used by one thread at a time."""
        self.transport = transport or Transport(config.prometheus)
        self.progress = progress or (lambda _n: None)

    def probe(self) -> None:
        """Raise HistoryError naming the server when it does not answer a trivial query."""
        try:
            self.transport.query("vector(1)")
        except SourceError as e:
            url = redact_url(self.config.prometheus.url or "")
            raise HistoryError(f"Prometheus at {url} does not answer: {e}") from None

    def read(self, query: str, start: float, end: float, step: float) -> Series:
        """The query's single series on the grid start + k * step up to `end`, NaN where
        it has no sample; SourceError when a request fails."""
        n = math.floor((end - start) / step) + 1
        values = np.full(n, np.nan)
        for chunk in chunks(start, end, step):
            times, got, _ = decode_matrix(self.transport.query_range(query, *chunk, step))
            self.progress(1)
            idx = np.round((times - start) / step).astype(np.int64)
            ok = (idx >= 0) & (idx < n)
            values[idx[ok]] = got[ok]
        return Series(start=start, step=step, values=values)

    def _signal(
        self,
        name: str,
        query: str,
        start: float,
        end: float,
        step: float,
        bounds: tuple[float, float],
    ) -> Signal:
        try:
            series = self.read(query, start, end, step)
        except SourceError as e:
            return Signal(name, query, None, f"query failed: {e}")
        if not np.isfinite(series.values).any():
            return Signal(name, query, None)
        values = series.values.copy()
        problem = drop_outside(values, bounds)  # never replayed
        return Signal(name, query, Series(series.start, series.step, values), problem)

    def workload(
        self, workload: WorkloadConfig, start: float, end: float, step: float
    ) -> WorkloadHistory:
        """Everything the replay needs of one workload (each signal None when absent; the
        GPU load is read only when there is no request rate)."""
        queries = self.config.prometheus.queries
        lookback = lookback_ms(step, None)
        ns, name = workload.namespace, workload.name
        template, what, why_not = request_template(workload, self.config)
        if template is None:
            requests = Signal(what, "", None, why_not)
        else:
            q = build_workload_query(template, ns, name, lookback)
            requests = self._signal(what, q, start, end, step, REQUESTS)
        q = build_workload_query(queries.workload_load, ns, name, lookback)
        load = Signal("workload_load", q, None)  # read only when needed: it costs a third
        if requests.series is None:
            load = self._signal("workload_load", q, start, end, step, LOAD)
        replicas = Signal("replicas", "", None)
        for signal_name, q in replica_queries(workload):
            replicas = self._signal(signal_name, q, start, end, step, REPLICAS)
            if replicas.series is not None:
                break
        return WorkloadHistory(workload.key, start, end, step, requests, load, replicas)

    def workloads(
        self,
        workloads: Sequence[WorkloadConfig],
        start: float,
        end: float,
        step: float,
        readers: int = READERS,
    ) -> list[WorkloadHistory]:
        """`workload` of each, in order, up to `readers` at a time, each thread with a
        reader of its own (one at a time on a transport given to this reader)."""
        if readers <= 1 or len(workloads) <= 1 or self.shared:
            return [self.workload(w, start, end, step) for w in workloads]
        local, lock = threading.local(), threading.Lock()

        def progress(n: int) -> None:
            with lock:  # one thread at a time on the progress bar
                self.progress(n)

        def one(w: WorkloadConfig) -> WorkloadHistory:
            if not hasattr(local, "reader"):
                local.reader = HistoryReader(self.config, progress=progress)
            reader: HistoryReader = local.reader
            return reader.workload(w, start, end, step)

        with ThreadPoolExecutor(max_workers=readers) as pool:
            return list(pool.map(one, workloads))
