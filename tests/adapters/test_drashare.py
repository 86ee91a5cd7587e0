"""Sharing under DRA: a pool's fragments and time slice read from the DeviceClasses and
ResourceClaimTemplates labelled for it, and what gpuscaler writes back into them, one row
each. GpuConfig's shape is kubernetes-sigs/dra-driver-nvidia-gpu
api/nvidia.com/resource/v1beta1/sharing.go and gpuconfig.go."""

from __future__ import annotations

import json
from typing import Any

import pytest
from draobjects import DRIVER, claim_template, device_class, gpu_slice
from kubeobjects import A100, POOL_LABEL, node

from gpuscaler.adapters.kube.cluster import current_state
from gpuscaler.adapters.kube.drashare import (
    DECISION,
    class_body,
    parse_opted,
    share_value,
    template_body,
)
from gpuscaler.adapters.kube.objects import parse_objects
from gpuscaler.config import parse_config

CONFIG = parse_config(
    f"node_pools: [{{name: a100, gpu_memory_gib: 40, selector: {{label: {POOL_LABEL}, value: {A100}}}}}]"
)
LABEL = {"gpuscaler.io/pool": "a100"}
GIB = float(1 << 30)


def opted(doc: dict[str, Any], pool: str = "a100", decided: str | None = None) -> dict[str, Any]:
    doc["metadata"]["labels"] = {"gpuscaler.io/pool": pool}
    if decided:
        record = json.dumps({"time": 5, "to": decided})
        doc["metadata"]["annotations"] = {DECISION["fragments"]: record}
    return doc


def template(memory: str = "10Gi", **kw: Any) -> dict[str, Any]:
    return opted(claim_template("ml", f"t-{memory}", memory=memory), **kw)


def gpu_class(sharing: dict[str, Any] | None = None, other: bool = False) -> dict[str, Any]:
    doc = opted(device_class("shared"))
    params = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}
    configs = [{"opaque": {"driver": "net.example.com", "parameters": {}}}] if other else []
    if sharing is not None:
        configs.append({"opaque": {"driver": DRIVER, "parameters": params | {"sharing": sharing}}})
    doc["spec"]["config"] = configs
    return doc


TS = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}
MPS = {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "10Gi"}}


def state(*objs: dict[str, Any], plugin: bool = False) -> tuple[Any, Any, Any]:
    items = [node("dra-1", config="ts-2" if plugin else None), gpu_slice("dra-1", 1), *objs]
    s = current_state(parse_objects(items, CONFIG), CONFIG)
    return s.fragments.get("a100"), s.time_slice_levels.get("a100"), s.problems.get("pool:a100")


@pytest.mark.parametrize(
    ("objs", "plugin", "expected"),
    [
        ([template("10Gi")], False, (4, "default", None)),
        ([template("10Gi"), gpu_class(TS)], False, (4, "long", None)),
        ([gpu_class()], False, (None, "default", None)),
        (
            [gpu_class({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25}})],
            False,
            (4, "default", None),
        ),
        ([template("10Gi"), template("20Gi", decided="2")], False, (2, "default", None)),
        ([opted(claim_template("ml", "whole"))], False, (None, "default", "requests no share")),
        ([template("10Gi", pool="elsewhere")], False, (None, "default", "fragments unknown")),
        ([template("10Gi")], True, (None, "default", "share by the device plugin")),
        (
            [gpu_class({**TS, "timeSlicingConfig": {"interval": "Eternal"}})],
            False,
            (None, "default", "GpuConfig"),
        ),
    ],
    ids=[
        "a template's claims of 10Gi of a 40Gi device are 4 fragments",
        "an opted-in class's TimeSlicing interval is the pool's level",
        "a class alone gives the level, and no fragments",
        "without a template, an MPS class's thread percentage gives the fragments",
        "templates that disagree mid-rollout give the newest decision's target",
        "a template asking for whole devices is a problem",
        "a template labelled for another pool is not read",
        "a pool sharing by the device plugin and DRA both is left alone",
        "an interval the driver does not know is a problem",
    ],
)
def test_a_pools_sharing_is_read_from_what_opted_in(
    objs: list[dict[str, Any]], plugin: bool, expected: tuple[Any, Any, str | None]
) -> None:
    fragments, level, problem = state(*objs, plugin=plugin)
    assert (fragments, level) == expected[:2]
    assert (problem is None) == (expected[2] is None)
    assert expected[2] is None or expected[2] in str(problem)


@pytest.mark.parametrize(
    ("capacity", "fragments", "key", "value"),
    [(40 * GIB, 3, "memory", 13653 * float(1 << 20)), (8, 3, "shares", 2), (4, 8, "shares", 1)],
    ids=["memory down to a whole MiB", "shares down to a whole share", "never below one step"],
)
def test_a_share_is_the_capacity_over_the_fragments_down_to_the_step(
    capacity: float, fragments: int, key: str, value: float
) -> None:
    assert share_value(capacity, fragments, key) == value


def test_a_template_is_written_again_with_its_share_requests_and_its_metadata() -> None:
    doc = template("10Gi")
    doc["metadata"] |= {"uid": "u", "resourceVersion": "7", "ownerReferences": [{"name": "o"}]}
    (o,) = parse_opted([doc], CONFIG)
    body = template_body(o, 2, {"memory": 40 * GIB})
    assert body is not None
    (ask,) = body["spec"]["spec"]["devices"]["requests"]
    assert ask["exactly"]["capacity"]["requests"] == {"memory": "20480Mi"}
    assert body["metadata"] == {
        "name": "t-10Gi",
        "namespace": "ml",
        "labels": LABEL,
        "ownerReferences": [{"name": "o"}],
    }
    assert template_body(o, 4, {"memory": 40 * GIB}) is None
    with pytest.raises(ValueError, match="publish no memory"):
        template_body(o, 2, {"shares": 4})


@pytest.mark.parametrize(
    ("doc", "kind", "value", "sharing"),
    [
        (
            gpu_class(),
            "time_slice",
            "short",
            {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}},
        ),
        (
            gpu_class(TS, other=True),
            "time_slice",
            "medium",
            {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Medium"}},
        ),
        (gpu_class(TS), "time_slice", "long", None),
        (
            gpu_class(MPS),
            "fragments",
            "3",
            {
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultPinnedDeviceMemoryLimit": "10Gi",
                    "defaultActiveThreadPercentage": 33,
                },
            },
        ),
    ],
    ids=[
        "a class without config gets a GpuConfig",
        "another driver's config is kept",
        "a class at the level is not written",
        "under MPS, fragments set the active thread percentage and keep the rest",
    ],
)
def test_a_classes_gpu_config_is_set_and_the_rest_kept(
    doc: dict[str, Any], kind: str, value: str, sharing: dict[str, Any] | None
) -> None:
    (o,) = parse_opted([doc], CONFIG)
    strategy = "MPS" if kind == "fragments" else "TimeSlicing"
    body = class_body(o, strategy, kind, value, CONFIG)
    if sharing is None:
        assert body is None
        return
    assert body is not None
    configs = body["spec"]["config"]
    assert configs[:-1] == doc["spec"]["config"][:-1]
    assert configs[-1]["opaque"]["driver"] == DRIVER
    assert configs[-1]["opaque"]["parameters"]["sharing"] == sharing


def test_a_class_sharing_by_another_strategy_than_the_pools_is_left_alone() -> None:
    (o,) = parse_opted([gpu_class(MPS)], CONFIG)
    with pytest.raises(ValueError, match="shares by MPS, not TimeSlicing"):
        class_body(o, "TimeSlicing", "time_slice", "long", CONFIG)
