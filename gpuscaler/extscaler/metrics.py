"""Prometheus metrics of the external scaler: what KEDA asked and what it was told.

Labels are bounded: methods and status codes are fixed lists, workloads are only the
managed ScaledObjects (a request for another one is counted, never labelled by name).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ExternalScalerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "gpuscaler_external_scaler_requests",
            "Requests to KEDA's external scaler, by method and gRPC status code.",
            ["method", "code"],
            registry=self.registry,
        )
        self.served = Gauge(
            "gpuscaler_external_scaler_served_floor",
            "The floor last served to KEDA for a ScaledObject (0: the reactive triggers "
            "decide: no fresh forecast).",
            ["workload"],
            registry=self.registry,
        )
        self.active = Gauge(
            "gpuscaler_external_scaler_active",
            "1 when the last IsActive answer for a ScaledObject was true.",
            ["workload"],
            registry=self.registry,
        )
