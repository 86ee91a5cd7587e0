"""KEDA's External Scaler service through a real gRPC client (grpcio, the generated stub
of kedacore/keda `pkg/scalers/externalscaler/externalscaler.proto`) against the real
server on 127.0.0.1, fed by controller tick results.

KEDA calls exactly these (kedacore/keda `pkg/scalers/external_scaler.go`): GetMetricSpec
with the ScaledObjectRef, GetMetrics with the metric name stripped of its `sN-` prefix,
then IsActive; StreamIsActive for `external-push`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from controlplane import wait_until

from gpuscaler.config import Config, WorkloadConfig
from gpuscaler.controller import TickResult
from gpuscaler.core.decisions import Decision, ReplicaFloorDecision, Skip
from gpuscaler.core.model import History, Plan, Signal, Snapshot, WorkloadObservation
from gpuscaler.extscaler.board import FloorBoard, ServedFloorActuator
from gpuscaler.extscaler.pb import externalscaler_pb2 as pb
from gpuscaler.extscaler.pb import externalscaler_pb2_grpc as pb_grpc
from gpuscaler.extscaler.server import ExternalScalerServer, ExternalScalerSetupError, serve

KEY = "ml/ScaledObject/chat"
ADDRESS = {"scalerAddress": "gpuscaler.gpuscaler.svc:9095"}


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def _config() -> Config:
    return Config(
        control={"interval": "10s"},
        workloads=(WorkloadConfig(namespace="ml", kind="ScaledObject", name="chat"),),
    )


def _tick(
    at: float,
    floor: int | None = 2,
    to: int | None = None,
    stale: bool = False,
    mode: str = "acting",
) -> TickResult:
    decisions: tuple[Decision, ...] = ()
    skips: tuple[Skip, ...] = ()
    if to is not None:
        decisions = (ReplicaFloorDecision(at, KEY, floor or 0, to, "forecast upper -> floor"),)
    elif stale:
        skips = (
            Skip(at, "replica_floor", KEY, "no action: stale: newest sample is 300s old", True),
        )
    else:
        skips = (Skip(at, "replica_floor", KEY, f"hold: floor stays {floor}", False),)
    obs = WorkloadObservation(KEY, Signal(last_sample_time=at, forecast=None), floor, replicas=2)
    snapshot = Snapshot(time=at, workloads=(obs,))
    return TickResult(snapshot, Plan(at, decisions, skips, History()), (), 0.01, mode)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def board(clock: Clock) -> FloorBoard:
    config = _config()
    return FloorBoard(lambda: config, clock=clock)


@pytest.fixture
def server(board: FloorBoard, clock: Clock) -> Iterator[ExternalScalerServer]:
    s = serve(board, 0, "127.0.0.1", workers=4, stream_interval=0.5)
    s.service.clock = clock
    try:
        yield s
    finally:
        s.stop(0.5)


@pytest.fixture
def stub(server: ExternalScalerServer) -> Iterator[pb_grpc.ExternalScalerStub]:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        yield pb_grpc.ExternalScalerStub(channel)


def _ref(name: str = "chat", namespace: str = "ml", **metadata: str) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(
        name=name, namespace=namespace, scalerMetadata={**ADDRESS, **metadata}
    )


def _floor(
    stub: pb_grpc.ExternalScalerStub, ref: pb.ScaledObjectRef | None = None
) -> tuple[float, bool]:
    """What KEDA reads: metricValueFloat when > 0, else metricValue; then IsActive."""
    ref = ref or _ref()
    got = stub.GetMetrics(
        pb.GetMetricsRequest(scaledObjectRef=ref, metricName="gpuscaler-replica-floor"), timeout=5
    )
    (value,) = got.metricValues
    assert value.metricName == "gpuscaler-replica-floor"
    number = value.metricValueFloat if value.metricValueFloat > 0 else float(value.metricValue)
    return number, stub.IsActive(ref, timeout=5).result


def test_the_metric_spec_is_one_floor_unit_per_replica(stub: pb_grpc.ExternalScalerStub) -> None:
    spec = stub.GetMetricSpec(_ref(), timeout=5)
    (metric,) = spec.metricSpecs
    assert metric.metricName == "gpuscaler-replica-floor"
    assert metric.targetSizeFloat == 1.0 and metric.targetSize == 1


def test_the_leaders_floor_is_served_as_the_metric_and_makes_the_trigger_active(
    stub: pb_grpc.ExternalScalerStub, board: FloorBoard, clock: Clock
) -> None:
    board.on_tick(_tick(clock.now, floor=2, to=7))
    assert _floor(stub) == (7.0, True)
    board.on_tick(_tick(clock.now + 10, floor=7))  # held: the floor stays
    clock.now += 10
    assert _floor(stub) == (7.0, True)


def test_a_standby_serves_its_own_plan_and_a_dry_run_serves_nothing(
    stub: pb_grpc.ExternalScalerStub, board: FloorBoard, clock: Clock
) -> None:
    board.on_tick(_tick(clock.now, floor=2, to=4, mode="standby"))
    assert _floor(stub) == (4.0, True)
    board.on_tick(_tick(clock.now, floor=2, to=4, mode="dry_run"))
    assert _floor(stub) == (0.0, False)


def test_without_a_fresh_forecast_the_reactive_triggers_decide(
    stub: pb_grpc.ExternalScalerStub, board: FloorBoard, clock: Clock
) -> None:
    assert _floor(stub) == (0.0, False)  # no tick yet
    board.on_tick(_tick(clock.now, floor=2, to=6))
    assert _floor(stub) == (6.0, True)
    board.on_tick(_tick(clock.now + 10, floor=6, stale=True))  # Prometheus went stale
    clock.now += 10
    assert _floor(stub) == (0.0, False)
    board.on_tick(_tick(clock.now + 10, floor=6))  # fresh again: the held floor returns
    clock.now += 10
    assert _floor(stub) == (6.0, True)
    clock.now += 31  # the controller stopped ticking: older than 3 intervals of 10 s
    assert _floor(stub) == (0.0, False)


def test_the_activation_floor_from_the_trigger_metadata_gates_is_active(
    stub: pb_grpc.ExternalScalerStub, board: FloorBoard, clock: Clock
) -> None:
    board.on_tick(_tick(clock.now, floor=2, to=3))
    assert _floor(stub, _ref(activationFloor="4")) == (3.0, False)
    assert _floor(stub, _ref(activationFloor="3")) == (3.0, True)


@pytest.mark.parametrize(
    ("ref", "metric", "code", "message"),
    [
        (_ref(name="other"), "gpuscaler-replica-floor", grpc.StatusCode.NOT_FOUND, "ScaledObject ml/other is not managed by gpuscaler"),
        (_ref(namespace="prod"), "gpuscaler-replica-floor", grpc.StatusCode.NOT_FOUND, "ScaledObject prod/chat is not managed"),
        (_ref(name=""), "gpuscaler-replica-floor", grpc.StatusCode.INVALID_ARGUMENT, "scaledObjectRef.name '' is not a ScaledObject name"),
        (_ref(activationFloor="lots"), "gpuscaler-replica-floor", grpc.StatusCode.INVALID_ARGUMENT, "activationFloor='lots' is not a whole number"),
        (_ref(threshold="5"), "gpuscaler-replica-floor", grpc.StatusCode.INVALID_ARGUMENT, "trigger metadata 'threshold' is not known to gpuscaler"),
        (_ref(), "s0-gpuscaler-replica-floor", grpc.StatusCode.INVALID_ARGUMENT, "metric 's0-gpuscaler-replica-floor' is not gpuscaler's"),
        (None, "gpuscaler-replica-floor", grpc.StatusCode.INVALID_ARGUMENT, "scaledObjectRef is missing"),
    ],
)  # fmt: skip
def test_bad_requests_get_a_grpc_error_naming_the_problem(
    stub: pb_grpc.ExternalScalerStub,
    board: FloorBoard,
    clock: Clock,
    ref: pb.ScaledObjectRef | None,
    metric: str,
    code: grpc.StatusCode,
    message: str,
) -> None:
    board.on_tick(_tick(clock.now, floor=2, to=5))
    request = pb.GetMetricsRequest(metricName=metric)
    if ref is not None:
        request.scaledObjectRef.CopyFrom(ref)
    with pytest.raises(grpc.RpcError) as e:
        stub.GetMetrics(request, timeout=5)
    assert e.value.code() == code
    assert message in e.value.details()
    if ref is not None and code == grpc.StatusCode.NOT_FOUND:
        for call in (stub.IsActive, stub.GetMetricSpec):
            with pytest.raises(grpc.RpcError) as e2:
                call(ref, timeout=5)
            assert e2.value.code() == code
    assert _floor(stub) == (5.0, True)  # the server goes on answering


def test_stream_is_active_sends_at_once_then_each_change(
    stub: pb_grpc.ExternalScalerStub, board: FloorBoard, clock: Clock
) -> None:
    stream = stub.StreamIsActive(_ref(), timeout=30)
    try:
        assert next(stream).result is False  # no tick yet
        board.on_tick(_tick(clock.now, floor=2, to=5))
        deadline = time.monotonic() + 20
        seen = False
        while not seen and time.monotonic() < deadline:
            seen = next(stream).result
        assert seen, "the stream never said active after the floor rose"
        board.on_tick(_tick(clock.now, floor=5, stale=True))
        while seen and time.monotonic() < deadline:
            seen = next(stream).result
        assert not seen, "the stream never said inactive after the forecast went stale"
    finally:
        stream.cancel()


def test_stream_is_active_refuses_an_unmanaged_scaled_object(
    stub: pb_grpc.ExternalScalerStub,
) -> None:
    with pytest.raises(grpc.RpcError) as e:
        next(stub.StreamIsActive(_ref(name="other"), timeout=10))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_stream_metric_spec_is_unimplemented_so_keda_falls_back_to_polling(
    stub: pb_grpc.ExternalScalerStub, caplog: pytest.LogCaptureFixture
) -> None:
    # KEDA: "If unimplemented (returns Unimplemented), KEDA silently falls back"; every
    # external-push ScaledObject asks once (the real KEDA did, tests/e2e_keda). An
    # expected answer: no error and no traceback in gpuscaler's log.
    with pytest.raises(grpc.RpcError) as e:
        next(stub.StreamMetricSpec(_ref(), timeout=10))
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "GetMetricSpec" in (e.value.details() or "")
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not noisy, [r.getMessage() for r in noisy]


def test_a_port_in_use_is_a_setup_error_naming_the_address(board: FloorBoard) -> None:
    first = serve(board, 0, "127.0.0.1")
    try:
        with pytest.raises(ExternalScalerSetupError, match=f"127.0.0.1:{first.port}"):
            serve(board, first.port, "127.0.0.1")
    finally:
        first.stop(0.5)


class _Recording:
    def __init__(self) -> None:
        self.got: list[tuple[Decision, ...]] = []

    def apply(self, decisions: tuple[Decision, ...]) -> tuple[Decision, ...]:
        self.got.append(tuple(decisions))
        return tuple(decisions)


def test_served_floors_are_never_handed_to_the_patching_actuator(board: FloorBoard) -> None:
    from gpuscaler.adapters.kube.objects import ClusterObjects, ScaleObject

    so = ScaleObject(
        KEY, 2, 40, None, True, False, external_addresses=("gpuscaler.gpuscaler:9095",)
    )
    hpa = ScaleObject("ml/HorizontalPodAutoscaler/batch", 1, 5, 1, True, False)
    board.see(ClusterObjects(scale_objects={KEY: so, hpa.key: hpa}))
    inner = _Recording()
    served = ReplicaFloorDecision(1.0, KEY, 2, 5, "r")
    patched = ReplicaFloorDecision(1.0, hpa.key, 1, 3, "r")
    applied = ServedFloorActuator(inner, board).apply((served, patched))
    assert inner.got == [(patched,)]
    assert set(applied) == {served, patched}


def test_every_answer_is_counted_and_the_served_floor_is_a_metric(
    stub: pb_grpc.ExternalScalerStub, server: ExternalScalerServer, board: FloorBoard, clock: Clock
) -> None:
    board.on_tick(_tick(clock.now, floor=2, to=5))
    assert _floor(stub) == (5.0, True)
    with pytest.raises(grpc.RpcError):
        stub.IsActive(_ref(name="other"), timeout=5)
    registry = server.service.metrics.registry

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    requests = "gpuscaler_external_scaler_requests_total"
    assert sample(requests, method="GetMetrics", code="OK") == 1
    assert sample(requests, method="IsActive", code="OK") == 1
    assert sample(requests, method="IsActive", code="NOT_FOUND") == 1
    assert sample("gpuscaler_external_scaler_served_floor", workload=KEY) == 5
    assert sample("gpuscaler_external_scaler_active", workload=KEY) == 1
    other = "ml/ScaledObject/other"
    assert sample("gpuscaler_external_scaler_served_floor", workload=other) is None


def test_run_with_the_external_scaler_port_taken_exits_2_naming_it(tmp_path: Path) -> None:
    import socket

    from builders import run_cli
    from kubefake import kubeconfig_for

    config = tmp_path / "gpuscaler.yaml"
    config.write_text(
        'prometheus: {url: "http://127.0.0.1:9"}\n'
        "workloads: [{namespace: ml, kind: ScaledObject, name: chat}]\n"
    )
    kubeconfig = kubeconfig_for("http://127.0.0.1:9", tmp_path / "kubeconfig")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run_cli(
            *("run", "--config", str(config), "--kubeconfig", str(kubeconfig)),
            *("--metrics-port", "0", "--external-scaler-port", str(port), "--max-ticks", "1"),
        )
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"external_scaler: cannot listen on 0.0.0.0:{port}" in out.stderr
    assert "Traceback" not in out.stderr


def test_open_streams_never_starve_the_polled_calls(
    stub: pb_grpc.ExternalScalerStub, board: FloorBoard, clock: Clock
) -> None:
    # 4 server threads (the fixture): at most 2 streams, 2 threads kept for GetMetrics.
    board.on_tick(_tick(clock.now, floor=2, to=5))
    streams = [stub.StreamIsActive(_ref(), timeout=60) for _ in range(2)]
    try:
        assert [next(s).result for s in streams] == [True, True]
        with pytest.raises(grpc.RpcError) as e:
            next(stub.StreamIsActive(_ref(), timeout=10))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "2 StreamIsActive streams are open already" in e.value.details()
        assert _floor(stub) == (5.0, True)  # the polled path still answers
        streams.pop().cancel()  # one closes: its thread comes back

        def reopened() -> bool:
            s = stub.StreamIsActive(_ref(), timeout=60)
            try:
                next(s)
            except grpc.RpcError:
                return False
            streams.append(s)
            return True

        wait_until("the closed stream's thread is free again", reopened, 20, 0.2)
    finally:
        for s in streams:
            s.cancel()


def test_a_scaled_object_with_only_gpuscalers_trigger_is_warned_about(
    board: FloorBoard, caplog: pytest.LogCaptureFixture
) -> None:
    from gpuscaler.adapters.kube.objects import ClusterObjects, ScaleObject

    address = ("gpuscaler.gpuscaler:9095",)
    alone = ScaleObject(KEY, 2, 40, None, True, False, external_addresses=address, triggers=1)
    paired = ScaleObject(
        "ml/ScaledObject/embedder", 1, 9, None, True, False, external_addresses=address, triggers=2
    )
    with caplog.at_level("WARNING", logger="gpuscaler.extscaler"):
        board.see(ClusterObjects(scale_objects={KEY: alone, paired.key: paired}))
        board.see(ClusterObjects(scale_objects={KEY: alone, paired.key: paired}))  # said once
    warned = [
        r.getMessage() for r in caplog.records if "no trigger but gpuscaler's" in r.getMessage()
    ]
    assert len(warned) == 1 and warned[0].startswith(KEY)
    assert board.external() == {KEY, paired.key}
