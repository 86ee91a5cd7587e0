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
from collections.abc import Callable, Iterator
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


USER_REPLICAS = 10
"""What the user's own trigger asks for while its window is open: above any floor here."""


def _user_trigger(open_now: bool) -> dict[str, Any]:
    """The user's own trigger, the ceiling: KEDA's cron scaler, which needs no network.
    pkg/scalers/cron_scaler.go: it asks for `desiredReplicas` and is active while the next
    end of its daily window comes before the next start, else asks for 0. Open: from 30
    minutes ago to 30 minutes on; closed: a window 12 hours away."""
    now = dt.datetime.now(dt.UTC)
    start, end = (
        (now - dt.timedelta(minutes=30), now + dt.timedelta(minutes=30))
        if open_now
        else (now + dt.timedelta(hours=12), now + dt.timedelta(hours=12, minutes=30))
    )
    return {
        "type": "cron",
        "metadata": {
            "timezone": "UTC",
            "start": f"{start.minute} {start.hour} * * *",
            "end": f"{end.minute} {end.hour} * * *",
            "desiredReplicas": str(USER_REPLICAS),
        },
    }


def _triggers(user_open: bool, trigger_type: str, port: int) -> list[dict[str, Any]]:
    gpuscaler = {"type": trigger_type, "metadata": {"scalerAddress": f"localhost:{port}"}}
    return [_user_trigger(user_open), gpuscaler]


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
                "triggers": _triggers(False, trigger_type, port),
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


class Watch:
    """What the test polls: gpuscaler's answer as KEDA asks for it, and the Deployment's
    replicas; the last few of each go into a failure's message with the logs."""

    def __init__(self, kube: Kube, keda: Keda, port: int):
        self.kube, self.keda, self.port = kube, keda, port
        self.served: list[tuple[float, bool]] = []
        self.seen: list[int] = []
        self.replica: Replica | None = None

    def look(self) -> tuple[int, bool, int]:
        """(floor served, rounded up as the HPA does; active; Deployment replicas)."""
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            self.served.append(_ask(pb_grpc.ExternalScalerStub(channel)))
        self.seen.append(_replicas(self.kube))
        return math.ceil(self.served[-1][0]), self.served[-1][1], self.seen[-1]

    def until(self, what: str, check: Callable[[int, bool, int], bool]) -> None:
        try:
            wait_until(what, lambda: check(*self.look()), WAIT, 2)
        except TimeoutError:
            log = self.replica.output()[-3000:] if self.replica else ""
            pytest.fail(
                f"{what}: served {self.served[-3:]}, replicas {self.seen[-3:]}\n"
                f"HPA: {_hpa_status(self.kube)}\n{self.keda.logs()}\n--- gpuscaler\n{log}"
            )


def _set_triggers(kube: Kube, triggers: list[dict[str, Any]]) -> None:
    kube.request("PATCH", SO, {"spec": {"triggers": triggers}}, "application/merge-patch+json")


@pytest.mark.timeout(900)  # KEDA's start and a few steps of WAIT at most, under load
@pytest.mark.parametrize("trigger_type", ["external", "external-push"])
def test_the_floor_moves_a_deployment_through_the_real_keda_and_goes_back_when_neutral(
    cluster: Kube, keda: Keda, tmp_path: Path, replicas: list[Replica], trigger_type: str
) -> None:
    port = keda.gpuscaler_port
    kubeconfig = cluster.plane.token_kubeconfig(HOME, "gpuscaler", tmp_path / "sa.kubeconfig")
    (tmp_path / "prom").mkdir()
    watch = Watch(cluster, keda, port)
    with planted_prometheus(tmp_path / "prom") as url:
        r = Replica(
            [
                *(GPUSCALER, "run", "--config", str(_config(tmp_path, url, CONFIG))),
                *("--kubeconfig", str(kubeconfig), "--metrics-port", "0"),
                *("--external-scaler-port", str(port)),
            ],
            _env(POD_NAME="gpuscaler-keda", POD_NAMESPACE=HOME),
            tmp_path / "run.log",
        )
        replicas.append(r)
        watch.replica = r
        watch.until("gpuscaler serves a floor above 2", lambda floor, _a, _r: floor > 2)
        # KEDA starts once gpuscaler answers, as after an install in that order: the HPA
        # KEDA makes holds the metric of every trigger whose GetMetricSpec answered when
        # it reconciled the ScaledObject; a trigger that failed then is left out of the
        # HPA (seen here: the HPA kept only the cron metric) until the object changes.
        keda.start()
        watch.until("the Deployment at the floor", lambda f, _a, n: 2 < f == n < USER_REPLICAS)
        _assert_the_hpa_reads_the_floor(cluster)
        # The user's trigger asks for more: the HPA takes the max, the user's ceiling.
        _set_triggers(cluster, _triggers(True, trigger_type, port))
        watch.until("the Deployment at the user's 10", lambda _f, _a, n: n == USER_REPLICAS)
        # It asks for nothing again: the floor keeps the replicas up.
        _set_triggers(cluster, _triggers(False, trigger_type, port))
        watch.until("the Deployment back at the floor", lambda f, _a, n: 2 < f == n)
        # Prometheus dies (the context ends): gpuscaler has no fresh input and answers 0.
    watch.until(
        "neutral, and back to minReplicaCount 2", lambda f, a, n: (f, a, n) == (0, False, 2)
    )
    so = cluster.get(SO)
    assert so["spec"]["minReplicaCount"] == 2  # never patched: served through KEDA
    assert "gpuscaler.io/last-decision" not in (so["metadata"].get("annotations") or {})
    assert "Traceback" not in r.output()
    r.signal(signal.SIGTERM)
    assert r.popen.wait(30) == 0, r.output()[-3000:]


def _assert_the_hpa_reads_the_floor(kube: Kube) -> None:
    hpa = kube.get(HPA)
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


def _hpa_status(kube: Kube) -> Any:
    try:
        return kube.get(HPA).get("status")
    except Exception as e:  # not made yet: say so in the failure
        return repr(e)
