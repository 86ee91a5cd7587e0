"""gpuscaler's floor through the real KEDA, end to end (issue 13): `make test-keda`.

A ScaledObject with the user's own trigger and gpuscaler's `type: external` trigger; the
real KEDA operator (kedacore/keda v2.21.0, tests/keda/build.sh) asks `gpuscaler run` for
the metric spec and makes the HPA; the controller-manager's HPA controller reads the
External metric through the aggregated API that KEDA's metrics adapter serves (which asks
the operator, which asks gpuscaler); the Deployment's replicas move to gpuscaler's floor.
When Prometheus dies, gpuscaler answers the neutral value and the replicas go back to the
ScaledObject's minReplicaCount. The ScaledObject's spec is never patched.

What the HPA controller needs, read in k8s.io/kubernetes pkg/controller/podautoscaler:
for an External metric with an AverageValue target, replica_calculator.go
GetExternalPerPodMetricReplicas wants ceil(value / target) replicas, from the metric
alone, no pod metrics or readiness (those count only for Resource and Pods metrics); it
reads the current replicas and selector from the Deployment's scale subresource, which
needs no kubelet. The HPA's default scale-down stabilization (300 s) is set to 0 through
the ScaledObject's `advanced.horizontalPodAutoscalerConfig`, as a user may.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import test_as_deployed as deployed
from controlplane import Kube, free_port, wait_until
from kubernetes.client.exceptions import ApiException
from test_as_deployed import GPUSCALER, HOME, SO, Replica, _env
from test_cluster_cli import _config, planted_prometheus
from test_extscaler_live import _ask

from e2e_keda.keda_plane import Keda
from gpuscaler.extscaler.pb import externalscaler_pb2_grpc as pb_grpc

cluster = deployed.cluster
replicas = deployed.replicas

HPA = "/apis/autoscaling/v2/namespaces/ml/horizontalpodautoscalers/keda-hpa-chat"
DEPLOYMENT = "/apis/apps/v1/namespaces/ml/deployments/chat"
CONFIG = """
external_scaler: {service_names: [localhost]}
metrics: {staleness: 10m}
"""
"""Added to the planted config: KEDA dials the trigger's scalerAddress, localhost here, so
that host names gpuscaler; and the planted samples (they end as the test starts) stay
fresh through KEDA's start. The floor goes neutral when Prometheus dies, not by age."""
WAIT = 240.0
"""Seconds for each step through KEDA: its polling (5 s here), the HPA's sync (2 s), the
Deployment; generous for a loaded 2-core machine."""


def _user_trigger() -> dict[str, Any]:
    """The user's own trigger, the ceiling: KEDA's cron scaler, which needs no network
    (pkg/scalers/cron_scaler.go: outside its window it asks for 0 replicas and is
    inactive). Its window is 12 hours away."""
    hour = (dt.datetime.now(dt.UTC).hour + 12) % 24
    return {
        "type": "cron",
        "metadata": {
            "timezone": "UTC",
            "start": f"0 {hour} * * *",
            "end": f"30 {hour} * * *",
            "desiredReplicas": "10",
        },
    }


@pytest.fixture
def trigger_type() -> str:
    """gpuscaler's trigger: `external` (KEDA polls IsActive) or `external-push` (KEDA
    holds a StreamIsActive stream); the test is parametrized over both."""
    return "external"


@pytest.fixture
def keda(cluster: Kube, tmp_path: Path, trigger_type: str) -> Iterator[Keda]:
    """KEDA for the control plane (`.start()` starts it), the dump's ScaledObject given triggers
    that reach only 127.0.0.1 (the dump's Prometheus address would be looked up in DNS)
    and the dump's KEDA-made HPA deleted (the operator makes its own)."""
    cluster.request("DELETE", HPA)
    port = free_port()
    behavior = {"scaleDown": {"stabilizationWindowSeconds": 0}}
    cluster.request(
        "PATCH",
        SO,
        {
            "spec": {
                "pollingInterval": 5,
                "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior}},
                "triggers": [
                    _user_trigger(),
                    {"type": trigger_type, "metadata": {"scalerAddress": f"localhost:{port}"}},
                ],
            }
        },
        "application/merge-patch+json",
    )
    (tmp_path / "keda").mkdir()
    k = Keda(cluster.plane, tmp_path / "keda")
    k.gpuscaler_port = port
    try:
        yield k  # started by the test once gpuscaler serves (see there)
    finally:
        _delete_while_keda_runs(cluster)
        k.stop()


def _delete_while_keda_runs(kube: Kube) -> None:
    """Delete the ScaledObject while KEDA can still remove its finalizer
    (`finalizer.keda.sh`); else the namespace would stay Terminating for the next test."""
    try:
        kube.request("DELETE", SO)
        wait_until("KEDA releases the ScaledObject", lambda: not _exists(kube, SO), 60, 0.5)
    except (ApiException, TimeoutError):  # KEDA is gone or stuck: drop the finalizer
        with contextlib.suppress(ApiException):
            kube.request(
                "PATCH", SO, {"metadata": {"finalizers": None}}, "application/merge-patch+json"
            )


def _exists(kube: Kube, path: str) -> bool:
    try:
        kube.get(path)
        return True
    except ApiException as e:
        if e.status == 404:
            return False
        raise


def _replicas(kube: Kube) -> int:
    return int(kube.get(DEPLOYMENT)["spec"]["replicas"])


def _external_metric(hpa: dict[str, Any]) -> dict[str, Any]:
    found = [m for m in hpa["spec"].get("metrics", []) if m["type"] == "External"]
    return next(
        m["external"] for m in found if "gpuscaler-replica-floor" in m["external"]["metric"]["name"]
    )


@pytest.mark.timeout(900)  # KEDA's start and two steps of WAIT at most, under load
@pytest.mark.parametrize("trigger_type", ["external", "external-push"])
def test_the_floor_moves_a_deployment_through_the_real_keda_and_goes_back_when_neutral(
    cluster: Kube, keda: Keda, tmp_path: Path, replicas: list[Replica], trigger_type: str
) -> None:
    port = keda.gpuscaler_port
    kubeconfig = cluster.plane.token_kubeconfig(HOME, "gpuscaler", tmp_path / "sa.kubeconfig")
    (tmp_path / "prom").mkdir()
    served: list[tuple[float, bool]] = []
    seen: list[int] = []

    def diagnosis() -> str:
        return (
            f"served {served[-3:]}, replicas {seen[-3:]}\nHPA: {_hpa_status(cluster)}\n"
            f"{keda.logs()}\n--- gpuscaler\n{r.output()[-3000:]}"
        )

    with planted_prometheus(tmp_path / "prom") as url:
        cfg = _config(tmp_path, url, CONFIG)
        r = Replica(
            [
                *(GPUSCALER, "run", "--config", str(cfg), "--kubeconfig", str(kubeconfig)),
                *("--metrics-port", "0", "--external-scaler-port", str(port)),
            ],
            _env(POD_NAME="gpuscaler-keda", POD_NAMESPACE=HOME),
            tmp_path / "run.log",
        )
        replicas.append(r)

        def floor_served() -> bool:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                served.append(_ask(pb_grpc.ExternalScalerStub(channel)))
            return served[-1][0] > 2

        try:
            wait_until("gpuscaler serves a floor above 2", floor_served, WAIT, 1)
        except TimeoutError:
            pytest.fail(diagnosis())
        # KEDA starts once gpuscaler answers, as after an install in that order: the HPA
        # KEDA makes holds the metric of every trigger whose GetMetricSpec answered when
        # it reconciled the ScaledObject; a trigger that failed then is left out of the
        # HPA (seen here: the HPA kept only the cron metric) until the object changes.
        keda.start()

        def deployment_at_the_floor() -> bool:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                served.append(_ask(pb_grpc.ExternalScalerStub(channel)))
            seen.append(_replicas(cluster))
            floor = math.ceil(served[-1][0])
            return floor > 2 and seen[-1] == floor

        try:
            wait_until(
                "the Deployment at gpuscaler's floor, above 2", deployment_at_the_floor, WAIT, 2
            )
        except TimeoutError:
            pytest.fail(diagnosis())
        hpa = cluster.get(HPA)
        assert hpa["metadata"]["ownerReferences"][0]["kind"] == "ScaledObject"  # KEDA's own
        metric = _external_metric(hpa)
        assert metric["target"] == {"type": "AverageValue", "averageValue": "1"}, metric
        # The HPA controller read it through KEDA's aggregated API (else ScalingActive False,
        # reason FailedGetExternalMetric).
        conditions = {c["type"]: c for c in hpa["status"]["conditions"]}
        assert conditions["ScalingActive"]["status"] == "True", conditions
        assert conditions["ScalingActive"]["reason"] == "ValidMetricFound", conditions
        read = [m for m in hpa["status"]["currentMetrics"] if m["type"] == "External"]
        assert any("gpuscaler-replica-floor" in m["external"]["metric"]["name"] for m in read), read
        so = cluster.get(SO)
        assert so["spec"]["minReplicaCount"] == 2  # never patched: served through KEDA
        assert "gpuscaler.io/last-decision" not in (so["metadata"].get("annotations") or {})
        # Prometheus dies (the context ends): gpuscaler has no fresh input and answers 0.

    def back_to_the_minimum() -> bool:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            served.append(_ask(pb_grpc.ExternalScalerStub(channel)))
        seen.append(_replicas(cluster))
        return served[-1] == (0.0, False) and seen[-1] == 2

    try:
        wait_until("the Deployment back at minReplicaCount 2", back_to_the_minimum, WAIT, 2)
    except TimeoutError:
        pytest.fail(diagnosis())
    assert cluster.get(SO)["spec"]["minReplicaCount"] == 2
    assert "Traceback" not in r.output()
    r.signal(signal.SIGTERM)
    assert r.popen.wait(30) == 0, r.output()[-3000:]


def _hpa_status(kube: Kube) -> Any:
    try:
        return kube.get(HPA).get("status")
    except Exception as e:  # not made yet: say so in the failure
        return repr(e)
