"""Replica floors through the official client against the real kube-apiserver, with the
real KEDA ScaledObject CRD (tests/data/crds) and autoscaling/v2 HPAs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from builders import NOW
from controlplane import Kube, wait_until
from kubefake import FakeCluster
from kubeobjects import deployment, hpa, scaled_object
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.adapters.kube.actuator import KubeActuator, kube_actuator
from gpuscaler.adapters.kube.api import KubeError
from gpuscaler.adapters.kube.writer import MAX_CONFLICT_RETRIES
from gpuscaler.config import Config, parse_config
from gpuscaler.core.decisions import ReplicaFloorDecision

SO = "/apis/keda.sh/v1alpha1/namespaces/{ns}/scaledobjects/{name}"
HPA = "/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers/{name}"


def _config(ns: str) -> Config:
    return parse_config(
        f"""
workloads:
  - {{namespace: {ns}, kind: ScaledObject, name: chat}}
  - {{namespace: {ns}, kind: HorizontalPodAutoscaler, name: embed}}
  - {{namespace: {ns}, kind: HorizontalPodAutoscaler, name: keda-hpa-chat}}
"""
    )


def _decision(target: str, old: int, new: int) -> ReplicaFloorDecision:
    reason = "forecast upper 490% -> 7 replicas"
    return ReplicaFloorDecision(NOW, target, old, new, reason, {"upper": 490.0})


Real = tuple[KubeActuator, Kube, str]


@pytest.fixture
def real(kube: Kube) -> Real:
    ns = kube.namespace()
    return kube_actuator(kube.api, _config(ns), identity="test"), kube, ns


def _events(kube: Kube, ns: str) -> list[dict[str, Any]]:
    items = kube.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e.get("reportingController") == "gpuscaler.io/controller"]


def test_a_scaled_object_floor_is_set_with_an_annotation_and_an_event(real: Real) -> None:
    workloads, kube, ns = real
    kube.create(scaled_object("chat", 2, namespace=ns))
    applied = workloads.apply([_decision(f"{ns}/ScaledObject/chat", 2, 7)])
    assert len(applied) == 1
    obj = kube.get(SO.format(ns=ns, name="chat"))
    assert obj["spec"]["minReplicaCount"] == 7
    record = json.loads(obj["metadata"]["annotations"]["gpuscaler.io/last-decision"])
    assert record["to"] == 7 and "forecast upper" in record["reason"]
    (event,) = _events(kube, ns)
    assert event["reason"] == "ReplicaFloorChanged" and "floor 2 -> 7" in event["note"]
    assert event["regarding"]["kind"] == "ScaledObject"
    assert event["regarding"]["uid"] == obj["metadata"]["uid"]


def test_a_floor_above_the_objects_maximum_now_is_not_written(real: Real) -> None:
    """The core clamps a floor to the maximum it observed, once; when the object's
    maximum fell below it since, nothing is written (the value recorded would differ
    from the one written) and the next tick decides again."""
    workloads, kube, ns = real
    kube.create(hpa("embed", 2, maximum=5, namespace=ns))
    assert workloads.apply([_decision(f"{ns}/HorizontalPodAutoscaler/embed", 2, 9)]) == ()
    obj = kube.get(HPA.format(ns=ns, name="embed"))
    assert obj["spec"]["minReplicas"] == 2
    assert "gpuscaler.io/last-decision" not in (obj["metadata"].get("annotations") or {})
    assert workloads.apply([_decision(f"{ns}/HorizontalPodAutoscaler/embed", 2, 5)])
    assert kube.get(HPA.format(ns=ns, name="embed"))["spec"]["minReplicas"] == 5


def test_no_write_when_the_floor_already_has_the_value(real: Real) -> None:
    workloads, kube, ns = real
    created = kube.create(scaled_object("chat", 7, namespace=ns))
    assert workloads.apply([_decision(f"{ns}/ScaledObject/chat", 7, 7)])
    after = kube.get(SO.format(ns=ns, name="chat"))
    assert after["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert _events(kube, ns) == []


@pytest.mark.parametrize(
    ("which", "target"),
    [
        ("not opted in", "ScaledObject/chat"),
        ("owned by KEDA", "HorizontalPodAutoscaler/keda-hpa-chat"),
    ],
)
def test_refused_objects_are_never_written(real: Real, which: str, target: str) -> None:
    workloads, kube, ns = real
    if which == "not opted in":
        obj = kube.create(scaled_object("chat", 2, opted=False, namespace=ns))
        path = SO.format(ns=ns, name="chat")
    else:
        owner = kube.create(scaled_object("chat", 2, namespace=ns))
        doc = hpa("keda-hpa-chat", 2, namespace=ns)
        doc["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "keda.sh/v1alpha1",
                "kind": "ScaledObject",
                "name": "chat",
                "uid": owner["metadata"]["uid"],
                "controller": True,
            }
        ]
        obj = kube.create(doc)
        path = HPA.format(ns=ns, name="keda-hpa-chat")
    assert workloads.apply([_decision(f"{ns}/{target}", 2, 7)]) == ()
    after = kube.get(path)  # (the real HPA controller writes the HPA's status meanwhile)
    assert after["spec"] == obj["spec"]
    assert "gpuscaler.io/last-decision" not in (after["metadata"].get("annotations") or {})


def test_a_real_conflict_is_re_read_and_retried(real: Real) -> None:
    workloads, kube, ns = real
    kube.create(scaled_object("chat", 2, namespace=ns))
    path = SO.format(ns=ns, name="chat")
    read = workloads.workloads.read
    reads: list[Any] = []

    def read_then_someone_writes(w: Any) -> Any:
        state = read(w)
        if not reads:  # another writer changes the object between our read and patch
            kube.patch(path, {"metadata": {"labels": {"team": "x"}}})
        reads.append(state)
        return state

    workloads.workloads.read = read_then_someone_writes  # type: ignore[method-assign]
    assert workloads.apply([_decision(f"{ns}/ScaledObject/chat", 2, 7)])
    assert len(reads) == 2  # the 409 made it read again
    obj = kube.get(path)
    assert obj["spec"]["minReplicaCount"] == 7 and obj["metadata"]["labels"]["team"] == "x"


def test_set_floor_with_a_stale_resource_version_never_overwrites_the_newer_object(
    real: Real,
) -> None:
    """Every read `set_floor` makes returns the state from before another writer's change,
    so each patch carries a stale resourceVersion: the real server refuses them all and
    the newer object stays."""
    workloads, kube, ns = real
    kube.create(scaled_object("chat", 2, namespace=ns))
    path = SO.format(ns=ns, name="chat")
    stale = workloads.workloads.read(workloads.workloads.config.workloads[0])
    kube.patch(path, {"spec": {"maxReplicaCount": 30}})
    reads: list[Any] = []

    def stale_read(w: Any) -> Any:
        reads.append(w)
        return stale

    workloads.workloads.read = stale_read  # type: ignore[method-assign]
    with pytest.raises(KubeError, match="still conflicting"):
        workloads.workloads.set_floor(_decision(f"{ns}/ScaledObject/chat", 2, 7))
    assert len(reads) == MAX_CONFLICT_RETRIES + 1
    obj = kube.get(path)
    assert obj["spec"]["minReplicaCount"] == 2 and obj["spec"]["maxReplicaCount"] == 30
    assert "gpuscaler.io/last-decision" not in (obj["metadata"].get("annotations") or {})


def test_the_crds_own_rule_refuses_a_floor_above_the_maximum(real: Real) -> None:
    """The KEDA CRD's CEL rule (minReplicaCount <= maxReplicaCount) is enforced by the
    real server: the reason gpuscaler clamps a floor to the object's maximum."""
    _, kube, ns = real
    kube.create(scaled_object("chat", 2, maximum=5, namespace=ns))
    with pytest.raises(ApiException) as info:
        kube.patch(SO.format(ns=ns, name="chat"), {"spec": {"minReplicaCount": 9}})
    assert info.value.status == 422 and "minReplicaCount must be less than" in str(info.value.body)


def test_a_missing_object_is_a_clear_error(real: Real) -> None:
    workloads, _, ns = real
    with pytest.raises(KubeError, match=f"read {ns}/ScaledObject/chat: HTTP 404"):
        workloads.workloads.read(workloads.workloads.config.workloads[0])


def test_the_real_hpa_controller_scales_the_workload_up_to_the_floor_written(real: Real) -> None:
    """The claim a floor rests on: the HPA controller (kube-controller-manager) raises
    the replicas to minReplicas whatever its metrics say (there are none here), and the
    ReplicaSet controller makes the pods."""
    workloads, kube, ns = real
    kube.create(deployment("embed", ns, 1))
    doc = hpa("embed", 1, maximum=8, namespace=ns)
    doc.pop("status")
    kube.create(doc)
    assert workloads.apply([_decision(f"{ns}/HorizontalPodAutoscaler/embed", 1, 4)])
    path = f"/apis/apps/v1/namespaces/{ns}/deployments/embed"
    wait_until(
        "the HPA controller scales to the floor",
        lambda: kube.get(path)["spec"]["replicas"] == 4,
        60,
        0.5,
    )
    wait_until(
        "the ReplicaSet makes the pods",
        lambda: len(kube.core.list_namespaced_pod(ns, label_selector="app=embed").items) == 4,
        60,
        0.5,
    )
    status = kube.get(HPA.format(ns=ns, name="embed"))["status"]
    assert status["desiredReplicas"] == 4


def test_a_server_error_leaves_the_object_unchanged_and_the_decision_unapplied(
    api: tuple[client.ApiClient, FakeCluster],
) -> None:
    # A 500 on the patch cannot be made on a real server on demand: the fake gives it.
    workloads, cluster = kube_actuator(api[0], _config("ml"), identity="test"), api[1]
    cluster.add("keda.sh/v1alpha1", "scaledobjects", scaled_object("chat", 2))
    cluster.fail_next("PATCH", r"/scaledobjects/chat$", 500)
    assert workloads.apply([_decision("ml/ScaledObject/chat", 2, 7)]) == ()
    obj = cluster.get("keda.sh/v1alpha1", "scaledobjects", "ml", "chat")
    assert obj is not None and obj["spec"]["minReplicaCount"] == 2
    assert "annotations" not in obj["metadata"]  # floor and annotation travel in one patch
