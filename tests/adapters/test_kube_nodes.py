"""Fragments and time slice of node pools, and the cluster state, against the real
kube-apiserver; the fake only for a 500 mid-rollout and an unreadable cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from builders import NOW
from controlplane import Kube, Recorder
from kubefake import FakeCluster
from kubemeta import annotations_of, labels_of, meta
from kubeobjects import A100, gpu_pod, hpa, node, plugin_configmap, scaled_object
from kubernetes import client

from gpuscaler.adapters.kube.actuator import KubeActuator, kube_actuator
from gpuscaler.adapters.kube.nodepools import sharing_config
from gpuscaler.adapters.kube.objects import rfc3339
from gpuscaler.adapters.kube.reader import ClusterReader
from gpuscaler.adapters.kube.writer import WriteBudget
from gpuscaler.config import Config, parse_config
from gpuscaler.core.decisions import FragmentsDecision, TimeSliceDecision


def _config(ns: str, extra: str = "", plugin_ns: str | None = None) -> Config:
    """The pool, workloads in `ns`, and the device-plugin ConfigMap in `plugin_ns` (`ns`)."""
    return parse_config(
        f"""
node_pools:
  - name: a100
    selector: {{label: nvidia.com/gpu.product, value: {A100}}}
    gpu_memory_gib: 80
    {extra}
workloads:
  - {{namespace: {ns}, kind: ScaledObject, name: chat}}
  - {{namespace: {ns}, kind: HorizontalPodAutoscaler, name: embed}}
kubernetes:
  device_plugin_config_map: {{namespace: {plugin_ns or ns}, name: gpuscaler-sharing-configs}}
"""
    )


CONFIG = _config("ml", plugin_ns="nvidia-device-plugin")  # the fake server's seeds


def _fragments(old: int, new: int, at: float = NOW) -> FragmentsDecision:
    return FragmentsDecision(at, "a100", old, new, f"forecast upper 30% < 40% ({new})")


class Real:
    """One test's real cluster: a fresh namespace for the ConfigMap and workloads, the
    actuator's client recorded (what the fake's request log was)."""

    def __init__(self, kube: Kube):
        self.kube = kube
        self.ns = kube.namespace()
        self.config = _config(self.ns)
        self.record = Recorder(kube.plane.api())

    def actuator(self, config: Config | None = None, **kw: Any) -> KubeActuator:
        return kube_actuator(self.record_api, config or self.config, "test", **kw)

    @property
    def record_api(self) -> client.ApiClient:
        return self.record.api

    def seed_pool(
        self, configs: dict[str, str], n: int = 3, opted_cm: bool = True, **kw: Any
    ) -> None:
        self.kube.create(plugin_configmap(configs, opted=opted_cm, namespace=self.ns))
        self.kube.seed([node(f"gpu-{i}", **kw) for i in range(n)])

    def pod(self, *args: Any, **kw: Any) -> None:
        self.kube.seed([gpu_pod(*args, **(kw | {"namespace": self.ns}))])

    def labels(self, name: str) -> dict[str, str]:
        return dict(labels_of(self.kube.core.read_node(name)))

    def configs(self, n: int) -> list[str]:
        """The sharing config each of the first `n` nodes names."""
        return [self.labels(f"gpu-{i}")["nvidia.com/device-plugin.config"] for i in range(n)]

    def configmap(self) -> dict[str, Any]:
        return self.kube.get(f"/api/v1/namespaces/{self.ns}/configmaps/gpuscaler-sharing-configs")

    def events(self) -> list[dict[str, Any]]:
        out = []
        for ns in (self.ns, "default"):
            items = self.kube.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
            out += [e for e in items if e.get("reportingInstance") == "test"]
        return out


@pytest.fixture
def real(kube: Kube) -> Real:
    return Real(kube)


def _labels(cluster: FakeCluster, name: str) -> dict[str, str]:
    obj = cluster.get("v1", "nodes", None, name)
    assert obj is not None
    return dict(obj["metadata"]["labels"])


def _seed_pool(cluster: FakeCluster, configs: dict[str, str], n: int = 3, **kw: object) -> None:
    cluster.add("v1", "configmaps", plugin_configmap(configs))
    for i in range(n):
        cluster.add("v1", "nodes", node(f"gpu-{i}", **kw))  # type: ignore[arg-type]


def test_more_fragments_add_the_named_config_then_relabel_a_few_nodes_per_tick(
    real: Real,
) -> None:
    actuator = real.actuator()
    real.seed_pool({"ts-2": sharing_config("time-slicing", 2)})
    # The config is added, but no node names it before the kubelet can have synced it to
    # every config-manager (which exits on a config it lacks).
    assert not actuator.apply([_fragments(2, 4)])
    ts4 = yaml.safe_load(real.configmap()["data"]["ts-4"])
    assert ts4["sharing"]["timeSlicing"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]
    added = real.configmap()["metadata"]["annotations"]["gpuscaler.io/config-added-ts-4"]
    assert added == rfc3339(NOW)
    assert set(real.configs(3)) == {"ts-2"}
    assert not actuator.apply([_fragments(2, 4, at=NOW + 60)])  # still propagating
    assert actuator.apply([_fragments(2, 4, at=NOW + 90)])
    assert real.configs(3) == ["ts-4", "ts-4", "ts-2"]  # max_nodes_per_tick = 2
    node0 = real.kube.core.read_node("gpu-0")
    record = json.loads(annotations_of(node0)["gpuscaler.io/last-fragments-decision"])
    assert record["to"] == 4 and "forecast upper" in record["reason"]
    events = real.events()
    assert sorted(e["reason"] for e in events) == [
        "FragmentsChanged",
        "FragmentsChanged",
        "SharingConfigAdded",
    ]
    # Events about a Node (cluster-scoped) live in `default`, regarding the real node.
    node_events = [e for e in events if e["regarding"]["kind"] == "Node"]
    assert {e["metadata"]["namespace"] for e in node_events} == {"default"}
    assert meta(node0).uid in {e["regarding"].get("uid") for e in node_events}
    # The pool reads as 4 while the rollout is under way, so the core does not decide again.
    state = ClusterReader(real.kube.api, real.config).state()
    assert state.fragments == {"a100": 4}
    # The next tick, with no new decision, finishes the rollout; then nothing is written.
    actuator.pools.reader.state()
    actuator.apply([])
    assert real.labels("gpu-2")["nvidia.com/device-plugin.config"] == "ts-4"
    actuator.pools.reader.state()
    before = len(real.record.writes())
    actuator.apply([])
    assert len(real.record.writes()) == before


def test_an_mps_pool_gets_an_mps_config(real: Real) -> None:
    config = _config(real.ns, "sharing: mps")
    actuator = real.actuator(config)
    real.seed_pool({}, config="mps-2")
    assert not actuator.apply([_fragments(2, 4)])  # added; named on nodes 90 s later
    assert actuator.apply([_fragments(2, 4, at=NOW + 90)])
    assert "mps" in yaml.safe_load(real.configmap()["data"]["mps-4"])["sharing"]
    assert real.labels("gpu-0")["nvidia.com/device-plugin.config"] == "mps-4"


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
    real: Real,
    caplog: pytest.LogCaptureFixture,
    configs: dict[str, str],
    cm_opted: bool,
    node_opted: bool,
    why: str,
) -> None:
    actuator = real.actuator()
    real.kube.create(plugin_configmap(configs, opted=cm_opted, namespace=real.ns))
    real.kube.seed([node("gpu-0"), node("gpu-1", opted=node_opted)])
    assert actuator.apply([_fragments(2, 4)]) == ()
    assert real.record.writes() == []
    assert why in caplog.text


def test_fewer_fragments_never_go_below_the_shares_pods_hold(real: Real) -> None:
    actuator = real.actuator()
    real.seed_pool({"ts-2": sharing_config("time-slicing", 2)}, n=2, config="ts-4", gpus=1)
    for i in range(3):  # 3 shares on gpu-0's single GPU
        real.pod(f"chat-{i}", "gpu-0")
    real.pod("done", "gpu-1", gpus=4, phase="Succeeded")
    actuator.pools.reader.state()
    assert actuator.apply([_fragments(4, 2)])
    assert real.labels("gpu-0")["nvidia.com/device-plugin.config"] == "ts-4"
    assert real.labels("gpu-1")["nvidia.com/device-plugin.config"] == "ts-2"


def test_a_time_slice_decision_relabels_the_pools_nodes(real: Real) -> None:
    actuator = real.actuator()
    real.seed_pool({}, n=2)
    d = TimeSliceDecision(NOW, "a100", "medium", "long", "stall 22% > 15% over 5m")
    assert actuator.apply([d])
    assert [real.labels(f"gpu-{i}")["gpuscaler.io/time-slice"] for i in range(2)] == ["long"] * 2
    assert real.configmap().get("data") is None  # time slice never touches the plugin config


def test_a_real_node_conflict_is_re_read_and_retried(real: Real) -> None:
    actuator = real.actuator()
    real.seed_pool({"ts-4": sharing_config("time-slicing", 4)}, n=1)
    actuator.pools.reader.state()  # the tick's read: gpu-0 at its current resourceVersion
    # Someone else (GFD, say) writes the node between the read and gpuscaler's patch.
    real.kube.request(
        "PATCH",
        "/api/v1/nodes/gpu-0",
        {"metadata": {"labels": {"feature.node.kubernetes.io/probe": "1"}}},
        "application/merge-patch+json",
    )
    assert (
        actuator.pools.roll_out(
            "fragments",
            real.config.node_pools[0],
            "4",
            json.dumps(_fragments(2, 4).as_record()),
            actuator.pools.reader.last_objects,
        )
        == 1
    )
    assert real.labels("gpu-0")["nvidia.com/device-plugin.config"] == "ts-4"
    node_calls = [(m, st) for m, p, st in real.record.calls if p == "/api/v1/nodes/gpu-0"]
    assert node_calls == [("PATCH", 409), ("GET", 200), ("PATCH", 200)]


def test_an_api_error_mid_rollout_leaves_each_node_whole_and_the_next_tick_resumes(
    api: tuple[client.ApiClient, FakeCluster],
) -> None:
    """Fake server: a 500 on the second node's patch cannot be made on a real server."""
    cluster = api[1]
    actuator = kube_actuator(api[0], CONFIG, identity="test")
    _seed_pool(cluster, {"ts-4": sharing_config("time-slicing", 4)}, n=2)
    cluster.fail_next("PATCH", r"/nodes/gpu-1$", 500)
    assert actuator.apply([_fragments(2, 4)])  # started: its cooldown runs from now
    gpu1 = cluster.get("v1", "nodes", None, "gpu-1")
    assert (
        gpu1 is not None and _labels(cluster, "gpu-1")["nvidia.com/device-plugin.config"] == "ts-2"
    )
    assert "gpuscaler.io/last-fragments-decision" not in gpu1["metadata"]["annotations"]
    actuator.apply([])  # the decision recorded on gpu-0 is carried on
    assert _labels(cluster, "gpu-1")["nvidia.com/device-plugin.config"] == "ts-4"


def test_writes_stop_when_the_budget_is_spent_or_leadership_is_lost(real: Real) -> None:
    real.seed_pool({"ts-4": sharing_config("time-slicing", 4)}, n=3)
    clock = [0.0]
    budget = WriteBudget(1, clock=lambda: clock[0])
    actuator = real.actuator(budget=budget)
    assert actuator.apply([_fragments(2, 4)])  # one node relabelled, then the budget is spent
    assert real.configs(3) == ["ts-4", "ts-2", "ts-2"]
    clock[0] = 61.0  # a minute later the budget is back
    leader = [False]
    actuator = real.actuator(may_act=lambda: leader[0], budget=budget)
    writes = len(real.record.writes())
    actuator.apply([])
    assert len(real.record.writes()) == writes  # not the leader: nothing written
    leader[0] = True
    actuator.apply([])
    assert real.labels("gpu-1")["nvidia.com/device-plugin.config"] == "ts-4"


def test_the_cluster_state_groups_nodes_into_pools_and_finds_workloads(real: Real) -> None:
    ns = real.ns
    real.kube.seed(
        [node("gpu-0", config="ts-4", gpus=2), node("cpu-0", config=None, product="none")]
    )
    for i in range(5):  # 5 shares over 2 GPUs: 3 on the fuller one
        real.pod(f"chat-{i}", "gpu-0")
    real.pod("pending", None, gpus=8, phase="Pending")
    real.kube.seed(
        [
            scaled_object("chat", 2, namespace=ns),
            hpa("keda-hpa-chat", 2, owner="chat", replicas=6, namespace=ns),
        ]
    )
    state = ClusterReader(real.kube.api, real.config).state()
    assert state.fragments == {"a100": 4}
    assert state.shares_held == {"a100": 3}
    assert state.gpu_memory_gib == {"a100": 80.0}
    assert state.time_slice_levels == {"a100": "default"}
    assert state.floors == {f"{ns}/ScaledObject/chat": 2}
    assert state.replicas == {f"{ns}/ScaledObject/chat": 6}  # from the HPA KEDA made for it
    assert state.problems == {
        f"workload:{ns}/HorizontalPodAutoscaler/embed": f"HorizontalPodAutoscaler {ns}/embed not found"
    }


def test_without_keda_installed_hpas_are_still_read(
    api: tuple[client.ApiClient, FakeCluster],
) -> None:
    """Fake server: the KEDA CRD is installed on the shared real server for good."""
    _, cluster = api
    cluster.add("autoscaling/v2", "horizontalpodautoscalers", hpa("embed", 3))
    cluster.fail_next("GET", r"/scaledobjects$", 404)
    state = ClusterReader(api[0], CONFIG).state()
    assert state.floors == {"ml/HorizontalPodAutoscaler/embed": 3}


def test_an_unreadable_cluster_flags_every_target_so_nothing_is_decided(
    api: tuple[client.ApiClient, FakeCluster],
) -> None:
    """Fake server: a 500 on listing nodes cannot be made on a real server."""
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
