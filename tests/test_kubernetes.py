"""Replica floors through the official client against the fake API server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from builders import NOW
from kubefake import FakeCluster, fake_apiserver
from kubeobjects import hpa, scaled_object
from kubernetes import client

from gpuscaler.adapters.kubernetes import KubeActuator, KubeError, kube_actuator
from gpuscaler.config import parse_config
from gpuscaler.core.model import Decision

CONFIG = parse_config(
    """
workloads:
  - {namespace: ml, kind: ScaledObject, name: chat}
  - {namespace: ml, kind: HorizontalPodAutoscaler, name: embed}
  - {namespace: ml, kind: HorizontalPodAutoscaler, name: keda-hpa-chat}
"""
)


def _decision(target: str, old: int, new: int) -> Decision:
    return Decision(
        NOW,
        "replica_floor",
        target,
        old,
        new,
        "forecast upper 490% -> 7 replicas",
        {"upper": 490.0},
    )


@pytest.fixture
def kube() -> Iterator[tuple[KubeActuator, FakeCluster]]:
    with (
        fake_apiserver() as (url, cluster),
        client.ApiClient(client.Configuration(host=url)) as api,
    ):
        yield kube_actuator(api, CONFIG, identity="test"), cluster


def test_a_scaled_object_floor_is_set_with_an_annotation_and_an_event(
    kube: tuple[KubeActuator, FakeCluster],
) -> None:
    workloads, cluster = kube
    cluster.add("keda.sh/v1alpha1", "scaledobjects", scaled_object("chat", 2))
    applied = workloads.apply([_decision("ml/ScaledObject/chat", 2, 7)])
    assert len(applied) == 1
    obj = cluster.get("keda.sh/v1alpha1", "scaledobjects", "ml", "chat")
    assert obj is not None and obj["spec"]["minReplicaCount"] == 7
    record = json.loads(obj["metadata"]["annotations"]["gpuscaler.io/last-decision"])
    assert record["to"] == 7 and "forecast upper" in record["reason"]
    events = [o for (g, p, _, _), o in cluster.objects.items() if p == "events"]
    assert len(events) == 1 and events[0]["reason"] == "ReplicaFloorChanged"
    assert events[0]["regarding"]["kind"] == "ScaledObject"


def test_an_hpa_floor_is_set_but_never_above_its_maximum(
    kube: tuple[KubeActuator, FakeCluster],
) -> None:
    workloads, cluster = kube
    cluster.add("autoscaling/v2", "horizontalpodautoscalers", hpa("embed", 2, maximum=5))
    assert workloads.apply([_decision("ml/HorizontalPodAutoscaler/embed", 2, 9)])
    obj = cluster.get("autoscaling/v2", "horizontalpodautoscalers", "ml", "embed")
    assert obj is not None and obj["spec"]["minReplicas"] == 5


def test_no_write_when_the_floor_already_has_the_value(
    kube: tuple[KubeActuator, FakeCluster],
) -> None:
    workloads, cluster = kube
    cluster.add("keda.sh/v1alpha1", "scaledobjects", scaled_object("chat", 7))
    assert workloads.apply([_decision("ml/ScaledObject/chat", 7, 7)])
    assert not [r for r in cluster.requests if r[0] == "PATCH"]


@pytest.mark.parametrize(
    ("seed", "target"),
    [
        (
            ("keda.sh/v1alpha1", "scaledobjects", scaled_object("chat", 2, opted=False)),
            "ml/ScaledObject/chat",
        ),
        (
            (
                "autoscaling/v2",
                "horizontalpodautoscalers",
                hpa("keda-hpa-chat", 2, owner="ScaledObject"),
            ),
            "ml/HorizontalPodAutoscaler/keda-hpa-chat",
        ),
    ],
    ids=["an object that did not opt in", "the HPA that KEDA owns"],
)
def test_refused_objects_are_never_written(
    kube: tuple[KubeActuator, FakeCluster], seed: tuple[str, str, dict[str, Any]], target: str
) -> None:
    workloads, cluster = kube
    cluster.add(*seed)
    assert workloads.apply([_decision(target, 2, 7)]) == ()
    assert not [r for r in cluster.requests if r[0] in ("PATCH", "PUT", "POST")]


def test_a_conflict_is_re_read_and_retried(kube: tuple[KubeActuator, FakeCluster]) -> None:
    workloads, cluster = kube
    cluster.add("keda.sh/v1alpha1", "scaledobjects", scaled_object("chat", 2))
    cluster.fail_next("PATCH", r"/scaledobjects/chat$", 409)
    assert workloads.apply([_decision("ml/ScaledObject/chat", 2, 7)])
    patches = [r for r in cluster.requests if r[0] == "PATCH"]
    assert len(patches) == 2
    obj = cluster.get("keda.sh/v1alpha1", "scaledobjects", "ml", "chat")
    assert obj is not None and obj["spec"]["minReplicaCount"] == 7


def test_a_stale_resource_version_is_never_overwritten(
    kube: tuple[KubeActuator, FakeCluster],
) -> None:
    workloads, cluster = kube
    cluster.add("keda.sh/v1alpha1", "scaledobjects", scaled_object("chat", 2))
    state = workloads.workloads.read(CONFIG.workloads[0])
    cluster.objects[("keda.sh/v1alpha1", "scaledobjects", "ml", "chat")]["metadata"][
        "resourceVersion"
    ] = "999999"
    body = {"metadata": {"resourceVersion": state.resource_version}, "spec": {"minReplicaCount": 9}}
    with pytest.raises(client.rest.ApiException) as info:
        workloads.workloads.custom.patch_namespaced_custom_object(
            "keda.sh", "v1alpha1", "ml", "scaledobjects", "chat", body
        )
    assert info.value.status == 409


def test_an_api_error_leaves_the_object_unchanged_and_the_decision_unapplied(
    kube: tuple[KubeActuator, FakeCluster],
) -> None:
    workloads, cluster = kube
    cluster.add("keda.sh/v1alpha1", "scaledobjects", scaled_object("chat", 2))
    cluster.fail_next("PATCH", r"/scaledobjects/chat$", 500)
    assert workloads.apply([_decision("ml/ScaledObject/chat", 2, 7)]) == ()
    obj = cluster.get("keda.sh/v1alpha1", "scaledobjects", "ml", "chat")
    assert obj is not None and obj["spec"]["minReplicaCount"] == 2
    assert "annotations" not in obj["metadata"]  # floor and annotation travel in one patch


def test_a_missing_object_is_a_clear_error(kube: tuple[KubeActuator, FakeCluster]) -> None:
    workloads, _ = kube
    with pytest.raises(KubeError, match="read ml/ScaledObject/chat: HTTP 404"):
        workloads.workloads.read(CONFIG.workloads[0])
