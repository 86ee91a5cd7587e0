"""Dynamic Resource Allocation objects (resource.k8s.io/v1) as a GPU driver, the scheduler
and the claim controller leave them. Shapes from kubernetes/kubernetes
staging/src/k8s.io/api/resource/v1/types.go; the device's attributes and `memory` capacity
as kubernetes-sigs/dra-driver-nvidia-gpu publishes them (cmd/gpu-kubelet-plugin/deviceinfo.go,
partitions.go); the DeviceClass is its chart's
(deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-gpu.yaml)."""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]
API = "resource.k8s.io/v1"
DRIVER = "gpu.nvidia.com"
PRODUCT = "NVIDIA A100-SXM4-40GB"


def gpu_device(name: str, kind: str = "gpu", memory: str = "40Gi") -> Json:
    return {
        "name": name,
        "attributes": {
            "type": {"string": kind},
            "productName": {"string": PRODUCT},
            "uuid": {"string": f"GPU-{name}"},
        },
        "capacity": {"memory": {"value": memory}},
    }


def shared(device: Json) -> Json:
    """`device` shared by claims consuming its memory: the driver's consumable-shares
    mode `memory` (cmd/gpu-kubelet-plugin/consumable_shares.go; KEP 5075)."""
    policy = {"default": "40Gi", "validRange": {"min": "1Mi", "max": "40Gi", "step": "1Mi"}}
    return device | {
        "allowMultipleAllocations": True,
        "capacity": {"memory": {"value": "40Gi", "requestPolicy": policy}},
    }


def gpu_slice(
    node: str,
    gpus: int = 2,
    driver: str = DRIVER,
    generation: int = 1,
    name: str | None = None,
    sharing: bool = False,
) -> Json:
    """One node's pool of GPUs, as the driver's kubelet plugin publishes it."""
    devices = [gpu_device(f"gpu-{i}") for i in range(gpus)]
    return {
        "apiVersion": API,
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [shared(d) for d in devices] if sharing else devices,
        },
    }


def device_class(name: str = DRIVER) -> Json:
    return {
        "apiVersion": API,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": "device.driver == 'gpu.nvidia.com' && "
                        "device.attributes['gpu.nvidia.com'].type == 'gpu'"
                    }
                }
            ]
        },
    }


def claim_template(
    namespace: str, name: str, count: int = 1, cls: str = DRIVER, memory: str | None = None
) -> Json:
    """Claims of `count` devices of class `cls`, or of `memory` of one shared device."""
    request = _request(count, cls)
    if memory:
        request["exactly"]["capacity"] = {"requests": {"memory": memory}}
    return {
        "apiVersion": API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def _request(count: int, cls: str) -> Json:
    return {"name": "gpu", "exactly": {"deviceClassName": cls, "count": count}}


def claim(
    name: str,
    namespace: str = "ml",
    count: int = 1,
    cls: str = DRIVER,
    devices: tuple[tuple[str, str, str], ...] = (),
    holders: tuple[str, ...] = (),
    consumed: Json | None = None,
) -> Json:
    """A claim; allocated `devices` (driver, pool, device) when given, reserved for the
    pods of UIDs `holders`."""
    obj: Json = {
        "apiVersion": API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [_request(count, cls)]}},
    }
    if devices:
        results = [
            {"request": "gpu", "driver": d, "pool": p, "device": dev}
            | ({"consumedCapacity": consumed} if consumed else {})
            for d, p, dev in devices
        ]
        obj["status"] = {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": u} for u in holders],
        }
    return obj


def claim_pod(
    name: str,
    namespace: str = "ml",
    node: str | None = None,
    claims: dict[str, str] | None = None,
    template: str | None = None,
    uid: str = "",
) -> Json:
    """A pod with one claim `gpu` from `template` (the claim controller names it in
    status.resourceClaimStatuses from `claims`), or naming existing claims `claims`."""
    refs: list[Json] = (
        [{"name": "gpu", "resourceClaimTemplateName": template}]
        if template
        else [{"name": k, "resourceClaimName": v} for k, v in (claims or {}).items()]
    )
    spec: Json = {
        "containers": [
            {
                "name": "main",
                "image": "x",
                "resources": {"claims": [{"name": r["name"]} for r in refs]},
            }
        ],
        "resourceClaims": refs,
    }
    if node:
        spec["nodeName"] = node
    status: Json = {"phase": "Running" if node else "Pending"}
    if template and claims:
        status["resourceClaimStatuses"] = [
            {"name": k, "resourceClaimName": v} for k, v in claims.items()
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": spec,
        "status": status,
    }
