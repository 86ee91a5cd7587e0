"""KEDA the way KEDA extends, on the real control plane with a real Prometheus.

- A ScaledObject with a `type: external` trigger pointing at gpuscaler is accepted by the
  real kube-apiserver under KEDA's own CRD (tests/data/crds, from kedacore/keda);
  `gpuscaler run` serves its forecast floor to a real gRPC client as KEDA would ask for it
  and never patches the object; when Prometheus goes away, the answer falls back to the
  neutral one (floor 0, inactive) instead of an error or a made-up floor.
- Spec patching stands back, with a Warning Event and a log line, when KEDA's pause
  annotation is set or a GitOps field manager (server-side apply as `argocd-controller`,
  Argo CD's manager name) owns the floor field.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import grpc
import pytest
import test_as_deployed as deployed
from controlplane import Kube, free_port, wait_until
from test_as_deployed import HOME, SO, Replica, _events
from test_cluster_cli import _config, planted_prometheus

from gpuscaler.extscaler.pb import externalscaler_pb2 as pb
from gpuscaler.extscaler.pb import externalscaler_pb2_grpc as pb_grpc

# The fixtures of the as-deployed tests: the realistic cluster, a planted Prometheus, and
# `gpuscaler run` processes stopped by PID.
cluster = deployed.cluster
prom_url = deployed.prom_url
replicas = deployed.replicas

ADDRESS = "gpuscaler.gpuscaler.svc:9095"
PROMETHEUS_TRIGGER = {
    "type": "prometheus",
    "metadata": {
        "query": 'sum(rate(http_requests_total{app="chat"}[1m]))',
        "serverAddress": "http://prometheus.monitoring:9090",
        "threshold": "50",
    },
}
EXTERNAL_TRIGGER = {"type": "external", "metadata": {"scalerAddress": ADDRESS}}


def _add_external_trigger(kube: Kube) -> dict[str, Any]:
    return kube.patch(SO, {"spec": {"triggers": [PROMETHEUS_TRIGGER, EXTERNAL_TRIGGER]}})


def _ask(stub: pb_grpc.ExternalScalerStub, name: str = "chat") -> tuple[float, bool]:
    """GetMetrics then IsActive, as KEDA's GetMetricsAndActivity does."""
    ref = pb.ScaledObjectRef(name=name, namespace="ml", scalerMetadata={"scalerAddress": ADDRESS})
    got = stub.GetMetrics(
        pb.GetMetricsRequest(scaledObjectRef=ref, metricName="gpuscaler-replica-floor"), timeout=5
    )
    value = got.metricValues[0]
    number = value.metricValueFloat if value.metricValueFloat > 0 else float(value.metricValue)
    return number, stub.IsActive(ref, timeout=5).result


def test_a_scaled_object_with_gpuscalers_external_trigger_is_accepted_by_kedas_crd(
    cluster: Kube,
) -> None:
    so = _add_external_trigger(cluster)
    assert so["spec"]["triggers"][1] == EXTERNAL_TRIGGER
    push = {"type": "external-push", "metadata": {"scalerAddress": ADDRESS, "activationFloor": "2"}}
    so = cluster.patch(SO, {"spec": {"triggers": [PROMETHEUS_TRIGGER, push]}})
    assert so["spec"]["triggers"][1]["type"] == "external-push"


def test_run_serves_the_floor_over_grpc_never_patches_and_goes_neutral_when_prometheus_dies(
    cluster: Kube, tmp_path: Path, replicas: list[Replica]
) -> None:
    _add_external_trigger(cluster)
    kubeconfig = cluster.plane.token_kubeconfig(HOME, "gpuscaler", tmp_path / "sa.kubeconfig")
    port = free_port()
    (tmp_path / "prom").mkdir()
    with planted_prometheus(tmp_path / "prom") as url:
        cfg = _config(tmp_path, url)
        flags = ("--metrics-port", "0", "--external-scaler-port", str(port))
        r = Replica.run(cfg, kubeconfig, "gpuscaler-ext", tmp_path / "run.log", *flags)
        replicas.append(r)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=60)
            except grpc.FutureTimeoutError:
                pytest.fail(f"the external scaler never listened; log:\n{r.output()[-3000:]}")
            stub = pb_grpc.ExternalScalerStub(channel)
            answers: list[tuple[float, bool]] = []

            def floor_served() -> bool:
                answers.append(_ask(stub))
                return answers[-1][0] > 2 and answers[-1][1]

            try:
                wait_until("a floor above the user's 2 is served", floor_served, 90, 1.0)
            except TimeoutError:
                pytest.fail(f"answers {answers[-5:]}; log:\n{r.output()[-3000:]}")
            so = cluster.get(SO)
            assert so["spec"]["minReplicaCount"] == 2  # the user's object is never patched
            assert "gpuscaler.io/last-decision" not in (so["metadata"].get("annotations") or {})
            assert "served through the external scaler" in r.output()
            with pytest.raises(grpc.RpcError) as e:
                _ask(stub, "embedder")  # no such managed ScaledObject
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
            assert "ml/embedder is not managed by gpuscaler" in e.value.details()
            # Prometheus dies (the context ends): the next ticks have no fresh input.
        neutral: list[tuple[float, bool]] = []

        def gone_neutral() -> bool:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                neutral.append(_ask(pb_grpc.ExternalScalerStub(channel)))
            return neutral[-1] == (0.0, False)

    try:
        wait_until("the neutral answer once Prometheus is gone", gone_neutral, 90, 1.0)
    except TimeoutError:
        pytest.fail(f"answers {neutral[-5:]}; log:\n{r.output()[-3000:]}")
    assert cluster.get(SO)["spec"]["minReplicaCount"] == 2
    r.signal(signal.SIGTERM)
    assert r.popen.wait(30) == 0, r.output()[-3000:]
    assert "Traceback" not in r.output()


def _run_twice(cluster: Kube, url: str, tmp_path: Path) -> str:
    out = deployed.run_two_ticks(cluster, _config(tmp_path, url), tmp_path, "gpuscaler-patch")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    return out.stderr


def _refusals(cluster: Kube) -> list[str]:
    return [e.get("note", "") for e in _events(cluster, "ml", "FloorPatchRefused")]


def test_a_scaled_object_paused_by_keda_keeps_its_floor_with_the_reason(
    cluster: Kube, prom_url: str, tmp_path: Path
) -> None:
    cluster.patch(SO, {"metadata": {"annotations": {"autoscaling.keda.sh/paused": "true"}}})
    log = _run_twice(cluster, prom_url, tmp_path)
    assert cluster.get(SO)["spec"]["minReplicaCount"] == 2
    notes = _refusals(cluster)
    assert len(notes) == 1, notes  # said once, not every tick
    assert "paused by KEDA (autoscaling.keda.sh/paused='true')" in notes[0]
    assert "not patched: paused by KEDA" in log


def test_a_floor_owned_by_argo_cds_field_manager_is_not_patched(
    cluster: Kube, prom_url: str, tmp_path: Path
) -> None:
    current = cluster.get(SO)
    applied = {  # what Argo CD's server-side apply sends, as its field manager
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "chat", "namespace": "ml", "labels": current["metadata"]["labels"]},
        "spec": {
            "scaleTargetRef": {"name": "chat"},
            "minReplicaCount": 2,
            "maxReplicaCount": 40,
            "triggers": [PROMETHEUS_TRIGGER],
        },
    }
    cluster.request(
        "PATCH",
        SO + "?fieldManager=argocd-controller&force=true",
        applied,
        "application/apply-patch+yaml",
    )
    managers = {m["manager"] for m in cluster.get(SO)["metadata"]["managedFields"]}
    assert "argocd-controller" in managers
    log = _run_twice(cluster, prom_url, tmp_path)
    assert cluster.get(SO)["spec"]["minReplicaCount"] == 2
    notes = _refusals(cluster)
    assert notes and "GitOps field manager 'argocd-controller'" in notes[0], notes
    assert "not patched" in log


def test_leader_and_standby_both_serve_the_floor_and_neither_patches(
    cluster: Kube, prom_url: str, tmp_path: Path, replicas: list[Replica]
) -> None:
    # KEDA keeps one gRPC connection and the Service may send it to either pod: a standby
    # must answer the floor too (from its own plan), not turn it off.
    _add_external_trigger(cluster)
    cfg = _config(tmp_path, prom_url)
    kubeconfig = cluster.plane.token_kubeconfig(HOME, "gpuscaler", tmp_path / "sa.kubeconfig")
    ports = {"gpuscaler-a": free_port(), "gpuscaler-b": free_port()}
    for name, port in ports.items():
        flags = ("--metrics-port", "0", "--external-scaler-port", str(port))
        r = Replica.run(cfg, kubeconfig, name, tmp_path / f"{name}.log", *flags)
        replicas.append(r)
        if name == "gpuscaler-a":
            wait_until("a leads", lambda: deployed._lease_holder(cluster) == "gpuscaler-a", 60)
    answers: dict[str, tuple[float, bool]] = {}

    def both_serve() -> bool:
        for name, port in ports.items():
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                try:
                    answers[name] = _ask(pb_grpc.ExternalScalerStub(channel))
                except grpc.RpcError as e:  # not listening yet
                    assert e.code() == grpc.StatusCode.UNAVAILABLE, e.details()
                    answers[name] = (-1.0, False)
        return all(value > 2 and active for value, active in answers.values())

    try:
        wait_until("leader and standby serve a floor above 2", both_serve, 120, 1.0)
    except TimeoutError:
        logs = "\n".join(r.output()[-1500:] for r in replicas)
        pytest.fail(f"answers {answers}; logs:\n{logs}")
    assert deployed._lease_holder(cluster) == "gpuscaler-a"
    assert "standby" in replicas[1].output()
    assert cluster.get(SO)["spec"]["minReplicaCount"] == 2
