"""The gRPC server around the servicer, and its assembly into `gpuscaler run`."""

from __future__ import annotations

import logging
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from prometheus_client import CollectorRegistry

from gpuscaler.errors import InputError
from gpuscaler.extscaler.board import FloorBoard, ServedFloorActuator, served_state
from gpuscaler.extscaler.pb import externalscaler_pb2_grpc as pb_grpc
from gpuscaler.extscaler.service import ExternalScalerMetrics, ExternalScalerService

log = logging.getLogger("gpuscaler.extscaler")


class ExternalScalerSetupError(InputError):
    """The service cannot listen where the config says (exit 2, the message says why)."""


@dataclass
class ExternalScalerServer:
    server: Any
    service: ExternalScalerService
    board: FloorBoard
    port: int

    def stop(self, grace: float = 2.0) -> None:
        self.service.stopping = True
        self.server.stop(grace).wait(grace + 1)


def serve(
    board: FloorBoard,
    port: int,
    host: str = "0.0.0.0",
    workers: int = 8,
    stream_interval: float = 5.0,
    metrics: ExternalScalerMetrics | None = None,
) -> ExternalScalerServer:
    """Listen on host:port (port 0: any free port, for tests); started."""
    # Two threads always stay free for the unary calls KEDA's HPA path makes.
    service = ExternalScalerService(
        board, stream_interval, metrics=metrics, max_streams=max(1, workers - 2)
    )
    # grpcio sets SO_REUSEPORT by default: a second process would share the port silently.
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers), options=[("grpc.so_reuseport", 0)]
    )
    pb_grpc.add_ExternalScalerServicer_to_server(service, server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as e:
        raise ExternalScalerSetupError(
            f"external_scaler: cannot listen on {address}: {e} (port in use? set "
            "external_scaler.port, or --external-scaler-port 0 to turn it off)"
        ) from None
    if not bound:
        raise ExternalScalerSetupError(f"external_scaler: cannot listen on {address}")
    server.start()
    log.info(
        "serving KEDA's external scaler (gRPC) on %s:%d",
        host,
        bound,
        extra={"event": "external_scaler_serving", "port": bound},
    )
    return ExternalScalerServer(server, service, board, bound)


def attach(
    parts: Any, port: int, host: str | None = None, registry: CollectorRegistry | None = None
) -> ExternalScalerServer:
    """Serve the floors of the controller in `parts` (`controller.assembly.ClusterController`):
    a board fed by every tick, served ScaledObjects taken out of the actuator, and their
    held floor given to the core as the current one."""
    controller = parts.controller
    cfg = controller.config.external_scaler
    board = FloorBoard(lambda: controller.config)
    controller.actuator = ServedFloorActuator(controller.actuator, board)
    prometheus = controller.source.prometheus
    prometheus.state = served_state(prometheus.state, board, lambda: parts.reader.last_objects)
    controller.stats.listeners.append(board.on_tick)
    controller.serves_floors = True  # a standby's floors must stay fresh: it ticks too
    metrics = ExternalScalerMetrics(registry)
    return serve(board, port, host or cfg.host, cfg.workers, cfg.stream_interval, metrics)
