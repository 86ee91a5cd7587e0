"""Prometheus metrics of the external scaler: what KEDA asked and what it was told.

Labels are bounded: methods and status codes are fixed lists, workloads are only the
managed ScaledObjects (a request for another one is counted, never labelled by name).
"""

from __future__ import annotations

from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge


class ExternalScalerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry or CollectorRegistry()
        gauge = partial(Gauge, registry=r)
        self.requests = Counter(
            "gpuscaler_external_scaler_requests",
            "Requests to KEDA's external scaler, by method and gRPC status code.",
            ["method", "code"],
            registry=r,
        )
        self.served = gauge(
            "gpuscaler_external_scaler_served_floor",
            "The floor last served to KEDA for a ScaledObject (0: the reactive triggers "
            "decide: no fresh forecast).",
            ["workload"],
        )
        self.active = gauge(
            "gpuscaler_external_scaler_active",
            "1 when the last IsActive answer for a ScaledObject was true.",
            ["workload"],
        )
