"""GPUs allocated by DRA, from ResourceSlices, ResourceClaims and pods to the observation:
the conversion rules, one row each."""

from __future__ import annotations

import re
from typing import Any

import pytest
from draobjects import DRIVER, claim, claim_pod, gpu_device, gpu_slice
from kubeobjects import gpu_pod, node

from gpuscaler.adapters.kube.dra import Device, parse_claim, parse_slice
from gpuscaler.adapters.kube.objects import ClusterStateError, parse_objects
from gpuscaler.adapters.kube.preemption_reader import preemption_observation
from gpuscaler.config import parse_config
from gpuscaler.core.preemption import DeviceHold

CONFIG = parse_config(
    "node_pools: [{name: a100, gpu_memory_gib: 80, selector: {label: pool, value: a}}]"
)
DRA = CONFIG.kubernetes.dra
GIB = 1 << 30


def _slice_with(**changes: Any) -> dict[str, Any]:
    obj = gpu_slice("dra-1", 1)
    obj["spec"] |= changes
    return obj


def test_a_gpu_drivers_slice_gives_its_devices_with_node_memory_and_product() -> None:
    (device,) = parse_slice(gpu_slice("dra-1", 1, generation=3), DRA)
    assert device == Device(
        DRIVER, "dra-1", "gpu-0", "dra-1", True, {"memory": 40.0 * GIB}, 3, "NVIDIA A100-SXM4-40GB"
    )


@pytest.mark.parametrize(
    ("spec", "found"),
    [
        ({"driver": "net.example.com"}, []),
        ({"devices": [gpu_device("mig-1g", kind="mig")]}, [False]),
        ({"devices": [{"name": "bare"}]}, [True]),
        ({"devices": None}, []),
        ({"nodeName": None, "allNodes": True}, [True]),
    ],
    ids=[
        "another driver's slice is ignored",
        "a MIG device is no whole GPU of its node",
        "a device without a type attribute counts as a GPU",
        "a slice without devices has none",
        "a network-attached device has no node",
    ],
)
def test_slice_rules(spec: dict[str, Any], found: list[bool]) -> None:
    assert [d.whole_gpu for d in parse_slice(_slice_with(**spec), DRA)] == found


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (
            {"devices": [gpu_device(f"g{i}") for i in range(129)]},
            "129 entries, over the API's bound of 128",
        ),
        (
            {
                "devices": [
                    gpu_device("g") | {"attributes": {f"a{i}": {"int": i} for i in range(32)}}
                ]
            },
            "over 32 attributes and capacities",
        ),
        (
            {"devices": [gpu_device("g", memory="lots")]},
            "capacity.memory: 'lots' is not a quantity",
        ),
        ({"pool": {"generation": 1}}, "spec.pool needs a name"),
        ({"devices": "gpu-0"}, "devices: not a list"),
    ],
    ids=[
        "too many devices",
        "too many attributes",
        "a bad quantity",
        "a pool without name",
        "devices not a list",
    ],
)
def test_a_malformed_or_oversized_slice_is_refused_by_name(
    spec: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValueError, match=re.escape("ResourceSlice dra-1-gpu.nvidia.com")) as e:
        parse_slice(_slice_with(**spec), DRA)
    assert problem in str(e.value)


ALLOCATED = ((DRIVER, "dra-1", "gpu-0"),)


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (claim("c", count=2), (False, 0, 2, set())),
        (claim("c", devices=ALLOCATED, holders=("u1",)), (True, 1, 1, {"u1"})),
        (claim("c", cls="nic.example.com", devices=(("nic.example.com", "p", "eth0"),)), None),
        (claim("c", cls="nic.example.com"), None),
        (
            claim("c", cls="gpu.nvidia.com", devices=(("other.example.com", "p", "g"),)),
            (True, 1, 1, set()),
        ),
        (claim("c", devices=ALLOCATED, holders=()), (True, 1, 1, set())),
    ],
    ids=[
        "an unallocated claim wants its GPUs",
        "an allocated claim holds its GPU for the pod reserved",
        "another driver's device in another class is no GPU",
        "a request for another class is no GPU",
        "a device of a GPU class counts, whatever its driver",
        "an allocation reserved for no pod yet",
    ],
)
def test_claim_rules(obj: dict[str, Any], expected: tuple[bool, int, int, set[str]] | None) -> None:
    c = parse_claim(obj, DRA)
    got = None if c is None else (c.allocated, len(c.gpus), c.wanted, set(c.holders))
    assert got == expected


def test_a_claims_preferred_alternative_is_what_it_wants() -> None:
    obj = claim("c")
    first = [
        {"name": "big", "deviceClassName": DRIVER, "count": 4},
        {"name": "small", "deviceClassName": DRIVER},
    ]
    obj["spec"]["devices"]["requests"] = [{"name": "gpu", "firstAvailable": first}]
    c = parse_claim(obj, DRA)
    assert c is not None and c.wanted == 4


@pytest.mark.parametrize(
    ("where", "value", "problem"),
    [
        ("results", [{"driver": DRIVER}] * 33, "33 entries, over the API's bound of 32"),
        ("reservedFor", [{"resource": "pods", "uid": "u"}] * 257, "over the API's bound of 256"),
        ("results", [{"driver": DRIVER, "pool": "p"}], "driver, pool and device must be strings"),
        ("consumed", {"memory": "x"}, "consumedCapacity.memory: 'x' is not a quantity"),
    ],
    ids=[
        "too many results",
        "too many pods reserved",
        "a result without device",
        "a bad consumed quantity",
    ],
)
def test_a_malformed_or_oversized_claim_is_refused_by_name(
    where: str, value: Any, problem: str
) -> None:
    obj = claim(
        "c", devices=ALLOCATED, holders=("u",), consumed=value if where == "consumed" else None
    )
    if where == "results":
        obj["status"]["allocation"]["devices"]["results"] = value
    elif where == "reservedFor":
        obj["status"]["reservedFor"] = value
    with pytest.raises(ValueError, match="ResourceClaim ml/c") as e:
        parse_claim(obj, DRA)
    assert problem in str(e.value)


def _mixed(config: Any = CONFIG) -> Any:
    """A device-plugin node with a pod, a DRA node with a pod holding one GPU, a pod
    waiting for two, and a pod whose only claim is a network card."""
    nic = claim(
        "nic",
        cls="nic.example.com",
        devices=(("nic.example.com", "n", "eth0"),),
        holders=("u-nic",),
    )
    items = [
        node("plugin-1", gpus=4, extra_labels={"pool": "a"}),
        node("dra-1", config=None, gpus=0, extra_labels={"pool": "a"}) | {"status": {}},
        gpu_pod("plugin-pod", "plugin-1", 2),
        gpu_slice("dra-1", 2),
        gpu_slice("dra-1", 8, generation=0, name="stale"),
        gpu_slice("nic-1", 2, driver="nic.example.com"),
        claim("held", devices=ALLOCATED, holders=("u-held",)),
        claim("asked", count=2),
        nic,
        claim_pod("holder", node="dra-1", template="t", claims={"gpu": "held"}, uid="u-held"),
        claim_pod("waiting", claims={"gpu": "asked"}, uid="u-waiting"),
        claim_pod("nic-user", node="dra-1", claims={"net": "nic"}, uid="u-nic"),
    ]
    for n in items[:2]:
        n["metadata"]["labels"].pop("nvidia.com/gpu.count", None)
        n["metadata"]["labels"].pop("nvidia.com/gpu.memory", None)
    items[0]["status"] = {"capacity": {"nvidia.com/gpu": "4"}}
    items[0]["metadata"]["labels"].pop("nvidia.com/device-plugin.config")
    return parse_objects(items, config)


def test_a_mixed_cluster_gives_both_kinds_of_gpu_with_holder_node_and_capacity() -> None:
    objects = _mixed()
    assert {n.name: (n.gpu_count, n.gpu_memory_mib) for n in objects.nodes} == {
        "plugin-1": (4, None),
        "dra-1": (2, 40 * 1024.0),  # the stale generation's 8 devices are not current
    }
    pods = {p.name: (p.node, p.gpus, p.devices) for p in objects.pods}
    hold = DeviceHold(DRIVER, "dra-1", "gpu-0", "ml/held", "dra-1", 1.0, 40.0)
    assert pods == {
        "plugin-pod": ("plugin-1", 2, ()),
        "holder": ("dra-1", 1, (hold,)),
        "waiting": (None, 2, ()),
    }
    seen = preemption_observation(objects, CONFIG, [], [])
    assert {v.key: (v.node, v.gpus, v.devices) for v in seen.pods}["ml/holder"] == (
        "dra-1",
        1,
        (hold,),
    )
    assert {n.name: n.shares for n in seen.nodes} == {"plugin-1": 4, "dra-1": 2}
    # What preemption frees whole devices by: the node's GPUs and which are allocated,
    # what the waiting pod asks for, whose claims still hold devices.
    keys = (f"{DRIVER}/dra-1/gpu-0", f"{DRIVER}/dra-1/gpu-1")
    assert {n.name: (n.devices, n.allocated, n.plugin) for n in seen.nodes} == {
        "plugin-1": ((), frozenset(), True),
        "dra-1": (keys, frozenset(keys[:1]), False),
    }
    assert {v.key: v.wanted_devices for v in seen.pods} == {
        "ml/plugin-pod": 0,
        "ml/holder": 0,
        "ml/waiting": 2,
    }
    assert seen.claim_holders == {"u-held"}


def test_a_share_of_a_device_under_consumable_capacity_is_its_part_of_the_capacity() -> None:
    shared = claim("part", devices=ALLOCATED, holders=("u",), consumed={"memory": "10Gi"})
    objects = parse_objects(
        [
            gpu_slice("dra-1", 1),
            shared,
            claim_pod("p", node="dra-1", claims={"g": "part"}, uid="u"),
        ],
        CONFIG,
    )
    (pod,) = objects.pods
    assert pod.devices == (DeviceHold(DRIVER, "dra-1", "gpu-0", "ml/part", "dra-1", 0.25, 10.0),)


def test_a_pod_holds_no_device_of_a_claim_reserved_for_another_pod() -> None:
    objects = parse_objects(
        [
            claim("c", devices=ALLOCATED, holders=("other",)),
            claim_pod("p", claims={"g": "c"}, uid="u"),
        ],
        CONFIG,
    )
    assert objects.pods == ()


def test_with_dra_off_only_the_device_plugins_gpus_are_seen() -> None:
    off = CONFIG.model_copy(
        update={
            "kubernetes": CONFIG.kubernetes.model_copy(
                update={"dra": DRA.model_copy(update={"enabled": False})}
            )
        }
    )
    objects = _mixed(off)
    assert [p.name for p in objects.pods] == ["plugin-pod"]
    assert {n.name: n.gpu_count for n in objects.nodes} == {"plugin-1": 4, "dra-1": None}


def test_an_oversized_slice_fails_the_read_like_any_unreadable_object() -> None:
    big = gpu_slice("dra-1", 129)
    with pytest.raises(
        ClusterStateError,
        match=re.escape("ResourceSlice dra-1-gpu.nvidia.com devices: 129 entries"),
    ):
        parse_objects([big], CONFIG)


def test_a_pending_claim_for_part_of_a_shared_device_is_seen_with_what_it_asks() -> None:
    asking = claim("part", count=1)
    asking["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {
        "requests": {"memory": "10Gi"}
    }
    objects = parse_objects(
        [
            node("dra-1", config=None, gpus=0, extra_labels={"pool": "a"}) | {"status": {}},
            gpu_slice("dra-1", 2, sharing=True),
            asking,
            claim_pod("p", claims={"g": "part"}, uid="u"),
        ],
        CONFIG,
    )
    (pod,) = objects.pods
    assert (pod.wanted_devices, dict(pod.wanted_capacity)) == (1, {"memory": 10 * 2.0**30})
    (dra_node,) = objects.nodes
    assert dict(dra_node.dra_shared) == {
        f"{DRIVER}/dra-1/gpu-{i}": {"memory": 40 * 2.0**30} for i in range(2)
    }
    seen = preemption_observation(objects, CONFIG, [], [])
    assert seen.pods[0].wanted_capacity == pod.wanted_capacity
    assert seen.nodes[0].shared == dra_node.dra_shared
