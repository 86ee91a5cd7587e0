"""Kubelet pod-resources adapter: which devices each pod on this node holds.

The kubelet serves `v1.PodResourcesLister` on a unix socket
(`/var/lib/kubelet/pod-resources/kubelet.sock`); `List` answers every pod with, per
container, the device IDs of each extended resource (for `nvidia.com/gpu`, GPU UUIDs, or
UUID::n replicas under time-slicing). The answer names pods by namespace and name (no UID);
the agent trusts it for which pods the kubelet runs, static pods without a mirror included.
The client is generated from the upstream api.proto (`gpuscaler.adapters.kubelet_pb`).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from gpuscaler.adapters.kubelet_pb import api_pb2, api_pb2_grpc


class PodResourcesError(Exception):
    """The kubelet's pod-resources API did not answer; the message says why."""


@dataclass(frozen=True)
class PodDevice:
    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str


@dataclass(frozen=True)
class KubeletPods:
    pods: frozenset[str]
    """"namespace/name" of every pod the kubelet runs (static pods included)."""
    devices: list[PodDevice]


def list_pods(socket: str, timeout: float, resource_prefix: str = "nvidia.com/") -> KubeletPods:
    """Every pod, and every (pod, container, device) of resources starting with
    `resource_prefix`."""
    try:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            stub = api_pb2_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
            answer = stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout)
    except grpc.RpcError as e:
        code = e.code() if hasattr(e, "code") else None
        details = e.details() if hasattr(e, "details") else str(e)
        raise PodResourcesError(f"pod-resources List on {socket}: {code}: {details}") from None
    devices = [
        PodDevice(pod.namespace, pod.name, container.name, devices.resource_name, device_id)
        for pod in answer.pod_resources
        for container in pod.containers
        for devices in container.devices
        if devices.resource_name.startswith(resource_prefix)
        for device_id in devices.device_ids
    ]
    return KubeletPods(frozenset(f"{p.namespace}/{p.name}" for p in answer.pod_resources), devices)


def gpu_of_device(device_id: str) -> str:
    """The GPU a device ID names: the NVIDIA device plugin advertises shared replicas as
    `<uuid>::<n>` (NVIDIA/k8s-device-plugin `internal/rm/devices.go`, NewAnnotatedID)."""
    return device_id.split("::", 1)[0]
