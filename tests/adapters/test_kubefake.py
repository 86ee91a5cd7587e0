"""The fake API server behaves like the real one where gpuscaler relies on it, checked
through the official kubernetes client."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubefake import FakeCluster, fake_apiserver, merge_patch, strategic_merge_patch
from kubemeta import labels_of, meta
from kubernetes import client
from kubernetes.client.exceptions import ApiException


@pytest.fixture
def api() -> Iterator[tuple[client.ApiClient, FakeCluster]]:
    with fake_apiserver() as (url, cluster):
        config = client.Configuration(host=url)
        with client.ApiClient(config) as api_client:
            yield api_client, cluster


def _node(name: str, labels: dict[str, str]) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def _pod(ns: str, name: str, labels: dict[str, str]) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }


def test_a_strategic_merge_patch_of_a_node_label_bumps_the_resource_version(
    api: tuple[client.ApiClient, FakeCluster],
) -> None:
    api_client, cluster = api
    cluster.add(
        "v1", "nodes", _node("gpu-1", {"nvidia.com/device-plugin.config": "ts-2", "pool": "a"})
    )
    core = client.CoreV1Api(api_client)
    before = meta(core.read_node("gpu-1")).resource_version
    core.patch_node("gpu-1", {"metadata": {"labels": {"nvidia.com/device-plugin.config": "ts-4"}}})
    node = core.read_node("gpu-1")
    assert labels_of(node) == {"nvidia.com/device-plugin.config": "ts-4", "pool": "a"}
    assert int(meta(node).resource_version or 0) > int(before or 0)
    assert ("PATCH", "/api/v1/nodes/gpu-1") in cluster.requests


def test_a_replace_with_a_stale_resource_version_is_a_conflict(
    api: tuple[client.ApiClient, FakeCluster],
) -> None:
    api_client, cluster = api
    cluster.add("v1", "nodes", _node("gpu-1", {}))
    core = client.CoreV1Api(api_client)
    node = core.read_node("gpu-1")
    core.patch_node("gpu-1", {"metadata": {"labels": {"x": "1"}}})  # someone else wrote
    meta(node).labels = {"x": "2"}
    with pytest.raises(ApiException) as info:
        core.replace_node("gpu-1", node)
    assert info.value.status == 409


def test_missing_objects_are_404_and_duplicates_409(
    api: tuple[client.ApiClient, FakeCluster],
) -> None:
    api_client, _ = api
    core = client.CoreV1Api(api_client)
    with pytest.raises(ApiException) as info:
        core.read_namespaced_pod("nope", "ml")
    assert info.value.status == 404
    core.create_namespaced_pod("ml", _pod("ml", "p", {}))
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod("ml", _pod("ml", "p", {}))
    assert info.value.status == 409


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=chat", ["a", "b"]),
        ("app=chat,tier!=low", ["a"]),
        ("tier in (low,mid)", ["b", "c"]),
        ("tier", ["b", "c"]),
        ("!tier", ["a"]),
    ],
)
def test_collections_filter_by_label_selector(
    api: tuple[client.ApiClient, FakeCluster], selector: str, expected: list[str]
) -> None:
    api_client, cluster = api
    cluster.add("v1", "pods", _pod("ml", "a", {"app": "chat"}))
    cluster.add("v1", "pods", _pod("ml", "b", {"app": "chat", "tier": "low"}))
    cluster.add("v1", "pods", _pod("ml", "c", {"app": "embed", "tier": "mid"}))
    pods = client.CoreV1Api(api_client).list_namespaced_pod("ml", label_selector=selector)
    assert [meta(p).name for p in pods.items] == expected


def test_eviction_is_refused_with_429_under_a_budget_and_allowed_without(
    api: tuple[client.ApiClient, FakeCluster],
) -> None:
    api_client, cluster = api
    cluster.add("v1", "pods", _pod("ml", "guarded", {"app": "train"}))
    cluster.add("v1", "pods", _pod("ml", "free", {"app": "batch"}))
    cluster.add(
        "policy/v1",
        "poddisruptionbudgets",
        {
            "metadata": {"name": "pdb", "namespace": "ml"},
            "spec": {"selector": {"matchLabels": {"app": "train"}}},
            "status": {"disruptionsAllowed": 0},
        },
    )
    core = client.CoreV1Api(api_client)
    eviction = client.V1Eviction(
        metadata=client.V1ObjectMeta(name="guarded", namespace="ml"),
        delete_options=client.V1DeleteOptions(grace_period_seconds=30),
    )
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod_eviction("guarded", "ml", eviction)
    assert info.value.status == 429
    meta(eviction).name = "free"
    core.create_namespaced_pod_eviction("free", "ml", eviction)
    assert cluster.get("v1", "pods", "ml", "free") is None
    assert cluster.get("v1", "pods", "ml", "guarded") is not None


def test_custom_objects_take_merge_patches_and_leases_and_events_are_objects(
    api: tuple[client.ApiClient, FakeCluster],
) -> None:
    api_client, cluster = api
    cluster.add(
        "keda.sh/v1alpha1",
        "scaledobjects",
        {
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "ScaledObject",
            "metadata": {"name": "chat", "namespace": "ml"},
            "spec": {"minReplicaCount": 1, "maxReplicaCount": 20},
        },
    )
    custom = client.CustomObjectsApi(api_client)
    custom.patch_namespaced_custom_object(
        "keda.sh", "v1alpha1", "ml", "scaledobjects", "chat", {"spec": {"minReplicaCount": 4}}
    )
    obj: Any = custom.get_namespaced_custom_object(
        "keda.sh", "v1alpha1", "ml", "scaledobjects", "chat"
    )
    assert obj["spec"] == {"minReplicaCount": 4, "maxReplicaCount": 20}
    coord = client.CoordinationV1Api(api_client)
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name="gpuscaler", namespace="gpuscaler"),
        spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15),
    )
    coord.create_namespaced_lease("gpuscaler", lease)
    read = coord.read_namespaced_lease("gpuscaler", "gpuscaler")
    assert read.spec is not None and read.spec.holder_identity == "a"
    events = client.EventsV1Api(api_client)
    events.create_namespaced_event(
        "ml",
        client.EventsV1Event(
            metadata=client.V1ObjectMeta(generate_name="chat."),
            reason="ReplicaFloor",
            note="floor 1 -> 4",
            action="SetFloor",
            reporting_controller="gpuscaler.io/controller",
            reporting_instance="a",
            event_time=datetime.now(UTC),
            type="Normal",
        ),
    )
    assert [e.reason for e in events.list_namespaced_event("ml").items] == ["ReplicaFloor"]


def test_an_injected_fault_fails_exactly_the_next_matching_request(
    api: tuple[client.ApiClient, FakeCluster],
) -> None:
    api_client, cluster = api
    cluster.add("v1", "nodes", _node("gpu-1", {}))
    cluster.fail_next("PATCH", r"/nodes/gpu-1$", 500)
    core = client.CoreV1Api(api_client)
    with pytest.raises(ApiException) as info:
        core.patch_node("gpu-1", {"metadata": {"labels": {"a": "1"}}})
    assert info.value.status == 500
    core.patch_node("gpu-1", {"metadata": {"labels": {"a": "1"}}})
    assert labels_of(core.read_node("gpu-1")) == {"a": "1"}


@pytest.mark.parametrize(
    ("target", "patch", "expected"),
    [
        ({"a": 1, "b": {"c": 2}}, {"b": {"c": None, "d": 3}}, {"a": 1, "b": {"d": 3}}),
        ({"l": [1, 2]}, {"l": [3]}, {"l": [3]}),
        ({"a": 1}, {"a": None}, {}),
    ],
)
def test_merge_patch_follows_rfc_7386(
    target: dict[str, object], patch: dict[str, object], expected: dict[str, object]
) -> None:
    assert merge_patch(target, patch) == expected


def test_strategic_merge_patch_merges_lists_of_objects_by_name_or_type() -> None:
    target = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    patch = {
        "status": {
            "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "Preempted"}]
        }
    }
    merged = strategic_merge_patch(target, patch)
    assert [c["type"] for c in merged["status"]["conditions"]] == ["Ready", "DisruptionTarget"]
