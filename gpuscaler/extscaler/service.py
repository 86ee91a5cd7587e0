"""The gRPC servicer: KEDA's four questions, answered from the board.

Request checks and answers are pure (`gpuscaler.core.external`); here they become gRPC:
malformed input is INVALID_ARGUMENT and a ScaledObject gpuscaler does not manage is
NOT_FOUND, each naming the problem. A managed ScaledObject with no fresh forecast gets the
neutral answer (floor 0, inactive), never an error: KEDA turns an error into a failing
HPA metric, and the HPA does not scale down while a metric fails.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, NoReturn

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuscaler.core.external import (
    METRIC_NAME,
    TARGET_SIZE,
    Answer,
    answer,
    check_metric_name,
    check_request,
)
from gpuscaler.extscaler.board import FloorBoard
from gpuscaler.extscaler.pb import externalscaler_pb2 as pb
from gpuscaler.extscaler.pb import externalscaler_pb2_grpc as pb_grpc

log = logging.getLogger("gpuscaler.extscaler")

NOT_MANAGED = (
    "is not managed by gpuscaler: label it gpuscaler.io/enabled=true or list it under "
    "workloads in the config"
)


class ExternalScalerMetrics:
    """What KEDA asked and was told; labels bounded (a ScaledObject not managed is never one)."""

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


class ExternalScalerService(pb_grpc.ExternalScalerServicer):
    def __init__(
        self,
        board: FloorBoard,
        stream_interval: float = 5.0,
        clock: Callable[[], float] = time.time,
        metrics: ExternalScalerMetrics | None = None,
        max_streams: int = 6,
    ):
        self.streams = threading.BoundedSemaphore(max_streams)
        """Each open stream holds a server thread; past this many, a new stream is refused
        (RESOURCE_EXHAUSTED) so GetMetrics and IsActive always find a free thread: a
        starved GetMetrics would fail KEDA's HPA metric."""
        self.max_streams = max_streams
        self.board = board
        self.stream_interval = stream_interval
        self.clock = clock
        self.metrics = metrics or ExternalScalerMetrics()
        self.stopping = False

    def _refuse(
        self, context: grpc.ServicerContext, method: str, code: grpc.StatusCode, message: str
    ) -> NoReturn:
        self.metrics.requests.labels(method, code.name).inc()
        log.warning(
            "external scaler: %s %s: %s",
            method,
            code.name,
            message,
            extra={"event": "external_scaler_refused", "method": method, "code": code.name},
        )
        context.abort(code, message)
        raise AssertionError("unreachable: abort raises")  # pragma: no cover

    def _answer(self, ref: Any, context: grpc.ServicerContext, method: str) -> tuple[str, Answer]:
        """(workload key, answer) for a request's ScaledObjectRef; aborts on bad input."""
        try:
            request = check_request(ref.name, ref.namespace, dict(ref.scalerMetadata))
        except ValueError as e:
            self._refuse(context, method, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        managed, entry = self.board.lookup(request.key)
        if not managed:
            self._refuse(
                context,
                method,
                grpc.StatusCode.NOT_FOUND,
                f"ScaledObject {ref.namespace}/{ref.name} {NOT_MANAGED}",
            )
        return request.key, answer(entry, self.clock(), self.board.max_age(), request.activation)

    def _ok(self, method: str) -> None:
        self.metrics.requests.labels(method, "OK").inc()

    def IsActive(self, request: Any, context: grpc.ServicerContext) -> Any:
        key, got = self._answer(request, context, "IsActive")
        self.metrics.active.labels(key).set(float(got.active))
        self._ok("IsActive")
        return pb.IsActiveResponse(result=got.active)

    def StreamIsActive(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        """The activity now, then again after every tick that changes it and at least
        every `stream_interval` (a keepalive KEDA's stream reader tolerates)."""
        method = "StreamIsActive"
        self._answer(request, context, method)  # bad input is refused before a thread is held
        if not self.streams.acquire(blocking=False):
            self._refuse(
                context,
                method,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self.max_streams} StreamIsActive streams are open already; raise "
                "external_scaler.workers (KEDA retries, and its polling goes on meanwhile)",
            )
        try:
            self._ok(method)
            yield from self._stream(request, context)
        finally:
            self.streams.release()

    def _stream(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        version = self.board.version
        last: bool | None = None
        sent_at = 0.0
        while context.is_active() and not self.stopping:
            key, got = self._answer(request, context, "StreamIsActive")
            now = time.monotonic()
            if got.active != last or now - sent_at >= self.stream_interval:
                self.metrics.active.labels(key).set(float(got.active))
                yield pb.IsActiveResponse(result=got.active)
                last, sent_at = got.active, now
            version = self.board.wait(version, min(1.0, self.stream_interval))

    def StreamMetricSpec(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        """UNIMPLEMENTED, on purpose: gpuscaler's metric spec never changes, and on this code
        KEDA stops asking and keeps GetMetricSpec (kedacore/keda pkg/scalers/
        external_scaler.go, streamMetricSpecOnce). Every external-push ScaledObject asks
        once; aborted here, since the generated base raises NotImplementedError, which
        grpcio logs as an error with a traceback."""
        self.metrics.requests.labels("StreamMetricSpec", "UNIMPLEMENTED").inc()
        context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "StreamMetricSpec: gpuscaler's metric spec never changes; use GetMetricSpec",
        )
        yield from ()  # a server-streaming handler: a generator, as grpcio calls it

    def GetMetricSpec(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._answer(request, context, "GetMetricSpec")  # a spec only for managed objects
        self._ok("GetMetricSpec")
        return pb.GetMetricSpecResponse(
            metricSpecs=[
                pb.MetricSpec(
                    metricName=METRIC_NAME,
                    targetSize=int(TARGET_SIZE),
                    targetSizeFloat=TARGET_SIZE,
                )
            ]
        )

    def GetMetrics(self, request: Any, context: grpc.ServicerContext) -> Any:
        method = "GetMetrics"
        if not request.HasField("scaledObjectRef"):
            self._refuse(
                context, method, grpc.StatusCode.INVALID_ARGUMENT, "scaledObjectRef is missing"
            )
        ref = request.scaledObjectRef
        key, got = self._answer(ref, context, method)
        try:
            check_metric_name(request.metricName, f"ScaledObject {ref.namespace}/{ref.name}")
        except ValueError as e:
            self._refuse(context, method, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        self.metrics.served.labels(key).set(got.value)
        self._ok(method)
        log.debug(
            "external scaler: %s floor %d (%s)",
            key,
            got.value,
            got.reason,
            extra={"event": "external_scaler_answer", "target": key, "value": got.value},
        )
        return pb.GetMetricsResponse(
            metricValues=[
                pb.MetricValue(
                    metricName=METRIC_NAME,
                    metricValue=got.value,
                    metricValueFloat=float(got.value),
                )
            ]
        )
