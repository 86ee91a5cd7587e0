"""Fragments and time slice of node pools, and the cluster state, against the fake API."""

from __future__ import annotations

import json

import pytest
import yaml
from builders import NOW
from kubefake import FakeCluster
from kubeobjects import A100, gpu_pod, hpa, node, plugin_configmap, scaled_object
from kubernetes import client

from gpuscaler.adapters.kubernetes import (
    ClusterReader,
    KubeActuator,
    WriteBudget,
    kube_actuator,
    sharing_config,
)
from gpuscaler.config import parse_config
from gpuscaler.core.model import Decision

CONFIG = parse_config(
    f"""
node_pools:
  - name: a100
    selector: {{label: nvidia.com/gpu.product, value: {A100}}}
    gpu_memory_gib: 80
workloads:
  - {{namespace: ml, kind: ScaledObject, name: chat}}
  - {{namespace: ml, kind: HorizontalPodAutoscaler, name: embed}}
"""
)
CM = ("v1", "configmaps", "nvidia-device-plugin", "gpuscaler-sharing-configs")


def _fragments(old: int, new: int, at: float = NOW) -> Decision:
    return Decision(at, "fragments", "a100", old, new, f"forecast upper 30% < 40% ({new})")


def _labels(cluster: FakeCluster, name: str) -> dict[str, str]:
    obj = cluster.get("v1", "nodes", None, name)
    assert obj is not None
    return dict(obj["metadata"]["labels"])


def _writes(cluster: FakeCluster) -> list[tuple[str, str]]:
    return [r for r in cluster.requests if r[0] in ("PATCH", "PUT", "POST", "DELETE")]


@pytest.fixture
def kube(api: tuple[client.ApiClient, FakeCluster]) -> tuple[KubeActuator, FakeCluster]:
    return kube_actuator(api[0], CONFIG, identity="test"), api[1]


def _seed_pool(cluster: FakeCluster, configs: dict[str, str], n: int = 3, **kw: object) -> None:
    cluster.add("v1", "configmaps", plugin_configmap(configs))
    for i in range(n):
        cluster.add("v1", "nodes", node(f"gpu-{i}", **kw))  # type: ignore[arg-type]


def test_more_fragments_add_the_named_config_then_relabel_a_few_nodes_per_tick(
    kube: tuple[KubeActuator, FakeCluster],
) -> None:
    actuator, cluster = kube
    _seed_pool(cluster, {"ts-2": sharing_config("time-slicing", 2)})
    assert actuator.apply([_fragments(2, 4)])
    cm = cluster.get(*CM)
    assert cm is not None
    ts4 = yaml.safe_load(cm["data"]["ts-4"])
    assert ts4["sharing"]["timeSlicing"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]
    labels = [_labels(cluster, f"gpu-{i}")["nvidia.com/device-plugin.config"] for i in range(3)]
    assert labels == ["ts-4", "ts-4", "ts-2"]  # max_nodes_per_tick = 2
    node0 = cluster.get("v1", "nodes", None, "gpu-0")
    assert node0 is not None
    record = json.loads(node0["metadata"]["annotations"]["gpuscaler.io/last-fragments-decision"])
    assert record["to"] == 4 and "forecast upper" in record["reason"]
    events = [o for (_, p, _, _), o in cluster.objects.items() if p == "events"]
    assert sorted(e["reason"] for e in events) == [
        "FragmentsChanged",
        "FragmentsChanged",
        "SharingConfigAdded",
    ]
    # The pool reads as 4 while the rollout is under way, so the core does not decide again.
    state = ClusterReader(actuator.pools.reader.core.api_client, CONFIG).state()
    assert state.fragments == {"a100": 4}
    # The next tick, with no new decision, finishes the rollout; then nothing is written.
    actuator.apply([])
    assert _labels(cluster, "gpu-2")["nvidia.com/device-plugin.config"] == "ts-4"
    before = len(_writes(cluster))
    actuator.apply([])
    assert len(_writes(cluster)) == before


def test_an_mps_pool_gets_an_mps_config(api: tuple[client.ApiClient, FakeCluster]) -> None:
    config = parse_config(
        f"node_pools: [{{name: a100, sharing: mps, gpu_memory_gib: 80, selector: {{label: nvidia.com/gpu.product, value: {A100}}}}}]"
    )
    actuator = kube_actuator(api[0], config, "test")
    _seed_pool(api[1], {}, config="mps-2")
    assert actuator.apply([_fragments(2, 4)])
    cm = api[1].get(*CM)
    assert cm is not None and "mps" in yaml.safe_load(cm["data"]["mps-4"])["sharing"]
    assert _labels(api[1], "gpu-0")["nvidia.com/device-plugin.config"] == "mps-4"


@pytest.mark.parametrize(
    ("configs", "cm_opted", "node_opted", "why"),
    [
        ({"ts-4": sharing_config("time-slicing", 2)}, True, True, "sets time-slicing with 2"),
        ({"ts-4": "not: [a, config"}, True, True, "not a device-plugin config"),
        ({}, False, True, "may not add it"),
        ({"ts-4": sharing_config("time-slicing", 4)}, True, False, "lack gpuscaler.io/enabled"),
    ],
    ids=[
        "an existing config of that name that says otherwise",
        "an existing config that is not YAML",
        "a missing config in a ConfigMap that did not opt in",
        "a pool with a node that did not opt in",
    ],
)
def test_a_fragments_change_is_refused_whole_and_nothing_is_written(
    kube: tuple[KubeActuator, FakeCluster],
    caplog: pytest.LogCaptureFixture,
    configs: dict[str, str],
    cm_opted: bool,
    node_opted: bool,
    why: str,
) -> None:
    actuator, cluster = kube
    cluster.add("v1", "configmaps", plugin_configmap(configs, opted=cm_opted))
    cluster.add("v1", "nodes", node("gpu-0"))
    cluster.add("v1", "nodes", node("gpu-1", opted=node_opted))
    assert actuator.apply([_fragments(2, 4)]) == ()
    assert _writes(cluster) == []
    assert why in caplog.text


def test_fewer_fragments_never_go_below_the_shares_pods_hold(
    kube: tuple[KubeActuator, FakeCluster],
) -> None:
    actuator, cluster = kube
    _seed_pool(cluster, {"ts-2": sharing_config("time-slicing", 2)}, n=2, config="ts-4", gpus=1)
    for i in range(3):  # 3 shares on gpu-0's single GPU
        cluster.add("v1", "pods", gpu_pod(f"chat-{i}", "gpu-0"))
    cluster.add("v1", "pods", gpu_pod("done", "gpu-1", gpus=4, phase="Succeeded"))
    assert actuator.apply([_fragments(4, 2)])
    assert _labels(cluster, "gpu-0")["nvidia.com/device-plugin.config"] == "ts-4"
    assert _labels(cluster, "gpu-1")["nvidia.com/device-plugin.config"] == "ts-2"


def test_a_time_slice_decision_relabels_the_pools_nodes(
    kube: tuple[KubeActuator, FakeCluster],
) -> None:
    actuator, cluster = kube
    _seed_pool(cluster, {}, n=2)
    d = Decision(NOW, "time_slice", "a100", "medium", "long", "stall 22% > 15% over 5m")
    assert actuator.apply([d])
    assert [_labels(cluster, f"gpu-{i}")["gpuscaler.io/time-slice"] for i in range(2)] == [
        "long",
        "long",
    ]
    cm = cluster.get(*CM)
    assert cm is not None and cm["data"] == {}  # time slice never touches the plugin config


def test_a_node_conflict_is_re_read_and_retried(kube: tuple[KubeActuator, FakeCluster]) -> None:
    actuator, cluster = kube
    _seed_pool(cluster, {"ts-4": sharing_config("time-slicing", 4)}, n=1)
    cluster.fail_next("PATCH", r"/nodes/gpu-0$", 409)
    assert actuator.apply([_fragments(2, 4)])
    assert _labels(cluster, "gpu-0")["nvidia.com/device-plugin.config"] == "ts-4"
    assert [r for r in cluster.requests if r[0] == "PATCH"] == [
        ("PATCH", "/api/v1/nodes/gpu-0"),
        ("PATCH", "/api/v1/nodes/gpu-0"),
    ]


def test_an_api_error_mid_rollout_leaves_each_node_whole_and_the_next_tick_resumes(
    kube: tuple[KubeActuator, FakeCluster],
) -> None:
    actuator, cluster = kube
    _seed_pool(cluster, {"ts-4": sharing_config("time-slicing", 4)}, n=2)
    cluster.fail_next("PATCH", r"/nodes/gpu-1$", 500)
    assert actuator.apply([_fragments(2, 4)])  # started: its cooldown runs from now
    gpu1 = cluster.get("v1", "nodes", None, "gpu-1")
    assert (
        gpu1 is not None and gpu1["metadata"]["labels"]["nvidia.com/device-plugin.config"] == "ts-2"
    )
    assert "gpuscaler.io/last-fragments-decision" not in gpu1["metadata"]["annotations"]
    actuator.apply([])  # the decision recorded on gpu-0 is carried on
    assert _labels(cluster, "gpu-1")["nvidia.com/device-plugin.config"] == "ts-4"


def test_writes_stop_when_the_budget_is_spent_or_leadership_is_lost(
    api: tuple[client.ApiClient, FakeCluster],
) -> None:
    _, cluster = api
    _seed_pool(cluster, {"ts-4": sharing_config("time-slicing", 4)}, n=3)
    clock = [0.0]
    budget = WriteBudget(1, clock=lambda: clock[0])
    actuator = kube_actuator(api[0], CONFIG, "test", budget=budget)
    assert actuator.apply([_fragments(2, 4)])  # one node relabelled, then the budget is spent
    assert [_labels(cluster, f"gpu-{i}")["nvidia.com/device-plugin.config"] for i in range(3)] == [
        "ts-4",
        "ts-2",
        "ts-2",
    ]
    clock[0] = 61.0  # a minute later the budget is back
    leader = [False]
    actuator = kube_actuator(api[0], CONFIG, "test", may_act=lambda: leader[0], budget=budget)
    writes = len(_writes(cluster))
    actuator.apply([])
    assert len(_writes(cluster)) == writes  # not the leader: nothing written
    leader[0] = True
    actuator.apply([])
    assert _labels(cluster, "gpu-1")["nvidia.com/device-plugin.config"] == "ts-4"


def test_the_cluster_state_groups_nodes_into_pools_and_finds_workloads(
    api: tuple[client.ApiClient, FakeCluster],
) -> None:
    _, cluster = api
    cluster.add("v1", "nodes", node("gpu-0", config="ts-4", gpus=2))
    cluster.add("v1", "nodes", node("cpu-0", config=None, product="none"))
    for i in range(5):  # 5 shares over 2 GPUs: 3 on the fuller one
        cluster.add("v1", "pods", gpu_pod(f"chat-{i}", "gpu-0"))
    cluster.add("v1", "pods", gpu_pod("pending", None, gpus=8, phase="Pending"))
    cluster.add("keda.sh/v1alpha1", "scaledobjects", scaled_object("chat", 2))
    cluster.add(
        "autoscaling/v2",
        "horizontalpodautoscalers",
        hpa("keda-hpa-chat", 2, owner="chat", replicas=6),
    )
    state = ClusterReader(api[0], CONFIG).state()
    assert state.fragments == {"a100": 4}
    assert state.shares_held == {"a100": 3}
    assert state.gpu_memory_gib == {"a100": 80.0}
    assert state.time_slice_levels == {"a100": "default"}
    assert state.floors == {"ml/ScaledObject/chat": 2}
    assert state.replicas == {"ml/ScaledObject/chat": 6}  # from the HPA KEDA made for it
    assert state.problems == {
        "workload:ml/HorizontalPodAutoscaler/embed": "HorizontalPodAutoscaler ml/embed not found"
    }


def test_without_keda_installed_hpas_are_still_read(
    api: tuple[client.ApiClient, FakeCluster],
) -> None:
    _, cluster = api
    cluster.add("autoscaling/v2", "horizontalpodautoscalers", hpa("embed", 3))
    cluster.fail_next("GET", r"/scaledobjects$", 404)
    state = ClusterReader(api[0], CONFIG).state()
    assert state.floors == {"ml/HorizontalPodAutoscaler/embed": 3}


def test_an_unreadable_cluster_flags_every_target_so_nothing_is_decided(
    api: tuple[client.ApiClient, FakeCluster],
) -> None:
    _, cluster = api
    cluster.fail_next("GET", r"/api/v1/nodes$", 500)
    reader = ClusterReader(api[0], CONFIG)
    state = reader.state()
    assert set(state.problems) == {
        "pool:a100",
        "workload:ml/ScaledObject/chat",
        "workload:ml/HorizontalPodAutoscaler/embed",
    }
    assert all("HTTP 500" in p for p in state.problems.values())
    assert not reader.healthy
