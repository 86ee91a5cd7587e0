"""The gRPC servicer: KEDA's four questions, answered from the board.

Request checks and answers are pure (`gpuscaler.core.external`); here they become gRPC:
malformed input is INVALID_ARGUMENT and a ScaledObject gpuscaler does not manage is
NOT_FOUND, each naming the problem. A managed ScaledObject with no fresh forecast gets the
neutral answer (floor 0, inactive), never an error: KEDA turns an error into a failing
HPA metric, and the HPA does not scale down while a metric fails.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import grpc

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


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    log.warning(
        "external scaler: %s: %s",
        code.name,
        message,
        extra={"event": "external_scaler_refused", "code": code.name},
    )
    context.abort(code, message)
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


class ExternalScalerService(pb_grpc.ExternalScalerServicer):
    def __init__(
        self,
        board: FloorBoard,
        stream_interval: float = 5.0,
        clock: Callable[[], float] = time.time,
    ):
        self.board = board
        self.stream_interval = stream_interval
        self.clock = clock
        self.stopping = False

    def _answer(self, ref: Any, context: grpc.ServicerContext) -> Answer:
        try:
            request = check_request(ref.name, ref.namespace, dict(ref.scalerMetadata))
        except ValueError as e:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        managed, entry = self.board.lookup(request.key)
        if not managed:
            _abort(
                context,
                grpc.StatusCode.NOT_FOUND,
                f"ScaledObject {ref.namespace}/{ref.name} {NOT_MANAGED}",
            )
        return answer(entry, self.clock(), self.board.max_age(), request.activation)

    def IsActive(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.IsActiveResponse(result=self._answer(request, context).active)

    def StreamIsActive(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        """The activity now, then again after every tick that changes it and at least
        every `stream_interval` (a keepalive KEDA's stream reader tolerates)."""
        version = self.board.version
        last: bool | None = None
        sent_at = 0.0
        while context.is_active() and not self.stopping:
            active = self._answer(request, context).active
            now = time.monotonic()
            if active != last or now - sent_at >= self.stream_interval:
                yield pb.IsActiveResponse(result=active)
                last, sent_at = active, now
            version = self.board.wait(version, min(1.0, self.stream_interval))

    def GetMetricSpec(self, request: Any, context: grpc.ServicerContext) -> Any:
        self._answer(request, context)  # the same checks: a spec only for managed objects
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
        if not request.HasField("scaledObjectRef"):
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "scaledObjectRef is missing")
        ref = request.scaledObjectRef
        got = self._answer(ref, context)
        try:
            check_metric_name(request.metricName, f"ScaledObject {ref.namespace}/{ref.name}")
        except ValueError as e:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        log.debug(
            "external scaler: %s/%s floor %d (%s)",
            ref.namespace,
            ref.name,
            got.value,
            got.reason,
            extra={"event": "external_scaler_answer", "value": got.value},
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
