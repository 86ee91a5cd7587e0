"""The agent's other pure decisions: time slice per GPU, the topology annotation, lifting
the quarantine; and the PCI bus id conversion between NVML and sysfs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuscaler.adapters.nvml import sysfs_bus_id
from gpuscaler.core.gpufit import GPUS_PER_NUMA_LABEL, TOPOLOGY_ANNOTATION
from gpuscaler.core.node_agent import (
    GpuFacts,
    TimeSlicePlan,
    applied_annotation,
    gpus_per_numa_domain,
    quarantine_decision,
    time_slice_plan,
    topology_annotation,
)
from gpuscaler.core.orphans import CgroupOwner, GpuProc, OrphanAction


def gpu(index: int, used: float = 300, mig: bool = False, numa: int = 0) -> GpuFacts:
    return GpuFacts(
        f"GPU-{index}", index, f"00000000:{index + 10:02X}:00.0", 81920, used, mig, numa
    )


@pytest.mark.parametrize(
    ("name", "label", "applied", "apply", "skipped", "problem"),
    [
        ("no label: nothing asked", None, {}, [], [], False),
        ("fresh start: every GPU", "medium", {}, [("GPU-0", 2), ("GPU-1", 2)], [], False),
        ("already applied: nothing", "medium", {"GPU-0": "medium", "GPU-1": "medium"}, [], [], False),
        (
            "label changed: every GPU",
            "long",
            {"GPU-0": "medium", "GPU-1": "medium"},
            [("GPU-0", 3), ("GPU-1", 3)],
            [],
            False,
        ),
        ("one GPU behind", "short", {"GPU-0": "short"}, [("GPU-1", 1)], [], False),
        ("a bad label value", "fast", {}, [], [], True),
    ],
)  # fmt: skip
def test_the_time_slice_is_set_only_where_it_differs(
    name: str,
    label: str | None,
    applied: dict[str, str],
    apply: list[tuple[str, int]],
    skipped: list[str],
    problem: bool,
) -> None:
    plan = time_slice_plan(label, [gpu(1), gpu(0)], applied)
    assert list(plan.apply) == apply, name
    assert (plan.problem is not None) == problem


def test_a_mig_gpu_is_skipped_with_a_reason() -> None:
    plan = time_slice_plan("default", [gpu(0), gpu(1, mig=True)], {})
    assert plan.apply == (("GPU-0", 0),)
    ((uuid, why),) = plan.skipped
    assert uuid == "GPU-1" and "MIG" in why


@pytest.mark.parametrize(
    ("failed", "current", "want"),
    [
        ({}, None, "long"),
        ({"GPU-0": "exit 1"}, None, None),
        ({"GPU-0": "exit 1"}, "short", "short"),
    ],
)
def test_a_failure_leaves_the_applied_annotation_as_it_was(
    failed: dict[str, str], current: str | None, want: str | None
) -> None:
    assert applied_annotation(TimeSlicePlan("long"), failed, current) == want


def test_the_topology_annotation_lists_every_gpu_by_index_with_the_extenders_keys() -> None:
    value = json.loads(topology_annotation([gpu(1, numa=1), gpu(0, numa=-1)]))
    assert value == [
        {
            "uuid": "GPU-0",
            "index": 0,
            "pci_bus_id": "00000000:0A:00.0",
            "memory_mib": 81920,
            "numa_node": -1,
        },
        {
            "uuid": "GPU-1",
            "index": 1,
            "pci_bus_id": "00000000:0B:00.0",
            "memory_mib": 81920,
            "numa_node": 1,
        },
    ]


def _action(kind: Any, gpu_uuid: str, owner: Any = "pod") -> OrphanAction:
    p = GpuProc(
        7, 1, gpu_uuid, 100.0, "python3", CgroupOwner(owner, "u" if owner == "pod" else None)
    )
    return OrphanAction(kind, p, "test")


@pytest.mark.parametrize(
    ("name", "quarantined", "gpus", "actions", "lift"),
    [
        ("not quarantined", False, [gpu(0, used=9000)], [], False),
        ("memory back below the threshold", True, [gpu(0, used=300), gpu(1, used=1024)], [], True),
        ("memory still held with no pod", True, [gpu(0, used=300), gpu(1, used=5000)], [], False),
        ("held by a live pod: in use, not leaked", True, [gpu(0, used=5000)], [_action("keep", "GPU-0")], True),
        ("an orphan still waiting", True, [gpu(0, used=300)], [_action("wait", "GPU-0")], False),
        (
            "a process with an unknown cgroup",
            True,
            [gpu(0, used=300)],
            [_action("report", "GPU-0", "unknown")],
            False,
        ),
        ("a host process holding memory", True, [gpu(0, used=5000)], [_action("keep", "GPU-0", "host")], False),
        ("pods unknown this poll", True, [gpu(0, used=0)], None, False),
    ],
)  # fmt: skip
def test_the_quarantine_is_lifted_only_when_every_gpu_is_clean(
    name: str,
    quarantined: bool,
    gpus: list[GpuFacts],
    actions: list[OrphanAction] | None,
    lift: bool,
) -> None:
    decision = quarantine_decision(quarantined, gpus, actions, 1024)
    assert decision.lift == lift, decision.reason
    assert decision.reason


@pytest.mark.parametrize(
    ("nvml", "sysfs"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("00000001:AF:1F.7", "0001:af:1f.7"),
        ("0000:07:00.0", "0000:07:00.0"),
    ],
)
def test_nvml_bus_ids_become_sysfs_names(nvml: str, sysfs: str) -> None:
    assert sysfs_bus_id(nvml) == sysfs


@pytest.mark.parametrize(
    "bad", ["", "3B:00.0", "00000000:3B:00", "0000:3b:20.0", "zz:00:00.0", "00000000:100:00.0"]
)
def test_a_malformed_bus_id_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        sysfs_bus_id(bad)


@given(st.integers(0, 0xFFFF), st.integers(0, 0xFF), st.integers(0, 0x1F), st.integers(0, 7))
def test_any_valid_bus_id_round_trips(domain: int, bus: int, device: int, function: int) -> None:
    nvml = f"{domain:08X}:{bus:02X}:{device:02X}.{function}"
    assert sysfs_bus_id(nvml) == f"{domain:04x}:{bus:02x}:{device:02x}.{function}"


def _topology(*numa: int) -> str:
    return topology_annotation([gpu(i, numa=n) for i, n in enumerate(numa)])


@pytest.mark.parametrize(
    ("name", "annotation", "size"),
    [
        ("two domains of four", _topology(0, 0, 0, 0, 1, 1, 1, 1), 4),
        ("one domain", _topology(0, 0), 2),
        ("uneven: the smallest", _topology(0, 0, 0, 1), 1),
        ("a GPU with an unknown domain", _topology(0, -1), None),
        ("absent", None, None),
        ("not JSON", "{", None),
        ("wrong shape", '[{"index": 0}]', None),
        ("empty list", "[]", None),
    ],
)
def test_the_numa_domain_size_comes_from_the_topology_annotation(
    name: str, annotation: str | None, size: int | None
) -> None:
    assert gpus_per_numa_domain(annotation) == size, name


@pytest.mark.parametrize(
    ("annotation", "label", "shares"),
    [
        (_topology(0, 0, 1, 1), None, 4),  # 2 GPUs a domain x 2 shares a GPU (ts-2)
        (_topology(0, 0, 1, 1), "4", 4),  # the agent's annotation wins over the label
        (_topology(0, -1, 1, 1), "1", 2),  # unknown domain: the label is the fallback
        (None, None, None),
    ],
)
def test_preemption_reads_the_numa_domains_the_agent_publishes(
    annotation: str | None, label: str | None, shares: int | None
) -> None:
    from kubeobjects import node

    from gpuscaler.adapters.kube.objects import parse_objects
    from gpuscaler.adapters.kube.preemption_reader import preemption_observation
    from gpuscaler.config import parse_config

    config = parse_config(
        "node_pools:\n  - {name: a100, gpu_memory_gib: 80, selector: {label: nvidia.com/gpu.product, value: NVIDIA-A100-SXM4-80GB}}\n"
    )
    doc = node("gpu-0", gpus=4, annotations={TOPOLOGY_ANNOTATION: annotation} if annotation else {})
    if label:
        doc["metadata"]["labels"][GPUS_PER_NUMA_LABEL] = label
    observation = preemption_observation(parse_objects([doc], config), config, [], [])
    (view,) = observation.nodes
    assert view.numa_domain_shares == shares
