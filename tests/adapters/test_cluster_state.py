"""Cluster state from Kubernetes objects: the parsing rules, one row each."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from kubeobjects import A100, gpu_pod, node

from gpuscaler.adapters.kube.cluster import pool_state, schedulable_on
from gpuscaler.adapters.kube.objects import ClusterStateError, parse_node, parse_objects
from gpuscaler.config import parse_config

CONFIG = parse_config(
    f"node_pools: [{{name: a100, gpu_memory_gib: 80, selector: {{label: nvidia.com/gpu.product, value: {A100}}}}}]"
)
POOL = CONFIG.node_pools[0]


def _decided(kind: str, to: object, at: float) -> dict[str, str]:
    key = {"fragments": "gpuscaler.io/last-fragments-decision"}[kind]
    return {key: json.dumps({"time": at, "to": to, "reason": "r"})}


@pytest.mark.parametrize(
    ("labels", "fragments"),
    [
        ({"nvidia.com/device-plugin.config": "ts-4"}, 4),
        ({"nvidia.com/device-plugin.config": "mps-8"}, 8),
        ({"nvidia.com/device-plugin.config": "custom", "nvidia.com/gpu.replicas": "2"}, 2),
        ({"nvidia.com/device-plugin.config": "ts-x"}, None),
        ({}, None),
    ],
    ids=[
        "a time-slicing config name",
        "an MPS config name",
        "a foreign config name, replicas from feature discovery",
        "a name that only looks like ours",
        "no sharing labels at all",
    ],
)
def test_a_nodes_fragments_come_from_its_sharing_labels(
    labels: dict[str, str], fragments: int | None
) -> None:
    obj = node("n", config=None, extra_labels=labels)
    assert parse_node(obj, CONFIG).fragments == fragments


def test_gpu_count_falls_back_to_capacity_over_replicas() -> None:
    obj = node("n", config="ts-4")
    del obj["metadata"]["labels"]["nvidia.com/gpu.count"]
    obj["status"]["capacity"]["nvidia.com/gpu"] = "32"
    assert parse_node(obj, CONFIG).gpu_count == 8


@pytest.mark.parametrize(
    ("nodes", "fragments", "problem"),
    [
        ([node("a", "ts-2"), node("b", "ts-2")], 2, None),
        (
            [node("a", "ts-4", annotations=_decided("fragments", 4, 10.0)), node("b", "ts-2")],
            4,
            None,
        ),
        ([node("a", "ts-2"), node("b", "ts-2"), node("c", "ts-4")], 2, None),
        ([node("a", "ts-2"), node("b", None)], None, "fragments unknown on node(s) b"),
        ([], None, "no node has nvidia.com/gpu.product"),
    ],
    ids=[
        "nodes that agree",
        "a rollout under way: the target of the newest decision",
        "a disagreement gpuscaler did not make: the most common value",
        "a node without a sharing label",
        "no nodes",
    ],
)
def test_a_pools_fragments(
    nodes: list[dict[str, Any]], fragments: int | None, problem: str | None
) -> None:
    state = pool_state(parse_objects(nodes, CONFIG), POOL)
    assert state.fragments == fragments
    assert (state.problem is None) if problem is None else (problem in (state.problem or ""))


@pytest.mark.parametrize(
    ("pods", "held"),
    [
        ([gpu_pod("a", "n", 3), gpu_pod("b", "n", 2)], 2),  # 5 shares over 4 GPUs
        ([gpu_pod("a", "n", 8)], 2),
        ([gpu_pod("a", "n", 4, phase="Succeeded"), gpu_pod("b", "n", 4, phase="Failed")], 0),
        ([gpu_pod("a", None, 8, phase="Pending")], 0),
        ([gpu_pod("a", "elsewhere", 8)], 0),
    ],
    ids=[
        "shares spread over the GPUs",
        "one big pod",
        "finished pods hold nothing",
        "pending pods hold nothing",
        "pods on other nodes",
    ],
)
def test_shares_held_per_gpu(pods: list[dict[str, Any]], held: int) -> None:
    objects = parse_objects([node("n", "ts-2", gpus=4), *pods], CONFIG)
    assert pool_state(objects, POOL).max_shares_held == held


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"kind": "Node", "metadata": {}}, "items[0]: Node: no metadata.name"),
        (
            node("n", extra_labels={"nvidia.com/gpu.count": "many"}),
            "items[0]: Node n nvidia.com/gpu.count: 'many'",
        ),
        (
            gpu_pod("p", "n", 1)
            | {
                "spec": {
                    "containers": [
                        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1.5"}}}
                    ]
                }
            },
            "container c nvidia.com/gpu: '1.5'",
        ),
        ("a string", "items[0]: not an object"),
    ],
    ids=[
        "no name",
        "a GPU count that is not a number",
        "a fractional GPU request",
        "not an object",
    ],
)
def test_garbage_objects_are_refused_naming_the_item_and_field(obj: Any, message: str) -> None:
    with pytest.raises(ClusterStateError, match=re.escape(message)):
        parse_objects([obj], CONFIG)


QUARANTINED = {"key": "gpuscaler.io/gpu-memory-held", "value": "true", "effect": "NoSchedule"}


def _affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    required = {"nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}
    return {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    }


def _expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


PRODUCT = "nvidia.com/gpu.product"


@pytest.mark.parametrize(
    ("spec", "taints", "fits"),
    [
        ({}, [], True),
        ({"nodeSelector": {PRODUCT: A100}}, [], True),
        ({"nodeSelector": {PRODUCT: "NVIDIA-L4"}}, [], False),
        (_affinity([_expr(PRODUCT, "In", A100)]), [], True),
        (_affinity([_expr(PRODUCT, "NotIn", A100)]), [], False),
        (
            _affinity([_expr("zone", "Exists")], [_expr("kubernetes.io/hostname", "Exists")]),
            [],
            True,
        ),
        ({}, [QUARANTINED], False),
        (
            {"tolerations": [{"key": "gpuscaler.io/gpu-memory-held", "operator": "Exists"}]},
            [QUARANTINED],
            True,
        ),
        (
            {"tolerations": [{"key": "gpuscaler.io/gpu-memory-held", "value": "false"}]},
            [QUARANTINED],
            False,
        ),
        ({}, [{"key": "maintenance", "effect": "PreferNoSchedule"}], True),
    ],
    ids=[
        "no constraints",
        "a matching nodeSelector",
        "a nodeSelector for another product",
        "required affinity In",
        "required affinity NotIn",
        "any one of several affinity terms",
        "a quarantine taint it does not tolerate",
        "a toleration for that taint",
        "a toleration for another value",
        "a soft taint does not keep it off",
    ],
)
def test_a_pending_pod_is_only_placed_where_the_scheduler_could(
    spec: dict[str, Any], taints: list[dict[str, str]], fits: bool
) -> None:
    raw = node("n")
    raw["spec"] = {"taints": taints}
    pending = gpu_pod("p", None)
    pending["spec"] |= spec
    objects = parse_objects([raw, pending], CONFIG)
    assert schedulable_on(objects.pods[0], objects.nodes[0]) is fits
