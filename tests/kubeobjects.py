"""Kubernetes objects as the API serves them, for the fake server, the real one and snapshot
files."""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]
POOL_LABEL = "nvidia.com/gpu.product"
A100 = "NVIDIA-A100-SXM4-80GB"


def node(
    name: str,
    config: str | None = "ts-2",
    gpus: int = 4,
    product: str = A100,
    opted: bool = True,
    extra_labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> Json:
    labels = {
        POOL_LABEL: product,
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": "81920",
        "kubernetes.io/hostname": name,
    }
    if config is not None:
        labels["nvidia.com/device-plugin.config"] = config
    if opted:
        labels["gpuscaler.io/enabled"] = "true"
    labels |= extra_labels or {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations or {}},
        "status": {"capacity": {"nvidia.com/gpu": str(gpus * 2)}},
    }


def gpu_pod(
    name: str,
    node_name: str | None,
    gpus: int = 1,
    namespace: str = "ml",
    priority: int = 0,
    phase: str = "Running",
) -> Json:
    spec: Json = {
        "containers": [
            {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
        ],
        "priority": priority,
    }
    if node_name is not None:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
        "status": {"phase": phase, "startTime": "2026-11-29T10:00:00Z"},
    }


def scaled_object(
    name: str, floor: int, maximum: int = 20, opted: bool = True, namespace: str = "ml"
) -> Json:
    labels = {"gpuscaler.io/enabled": "true"} if opted else {}
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "minReplicaCount": floor,
            "maxReplicaCount": maximum,
            "scaleTargetRef": {"name": name},
            # The real CRD requires triggers (kedacore/keda config/crd/bases).
            "triggers": [{"type": "cpu", "metricType": "Utilization", "metadata": {"value": "70"}}],
        },
    }


def hpa(
    name: str,
    floor: int,
    maximum: int = 10,
    owner: str | None = None,
    replicas: int | None = None,
    namespace: str = "ml",
) -> Json:
    meta: Json = {"name": name, "namespace": namespace, "labels": {"gpuscaler.io/enabled": "true"}}
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "name": owner, "uid": "u"}
        ]
    current = floor if replicas is None else replicas
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": meta,
        "spec": {
            "minReplicas": floor,
            "maxReplicas": maximum,
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
        },
        "status": {"currentReplicas": current, "desiredReplicas": current},
    }


def plugin_configmap(
    data: dict[str, str], opted: bool = True, namespace: str = "nvidia-device-plugin"
) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "gpuscaler-sharing-configs",
            "namespace": namespace,
            "labels": {"gpuscaler.io/enabled": "true"} if opted else {},
        },
        "data": data,
    }


def bare_pod(name: str, namespace: str, node_name: str | None = None, **spec: Any) -> Json:
    """A bare pod of one container (`spec` added to its spec), as a user creates it."""
    body: Json = {"containers": [{"name": "main", "image": "x"}], **spec}
    if node_name is not None:
        body["nodeName"] = node_name
    meta = {"name": name, "namespace": namespace}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


def classed_pod(name: str, node_name: str | None, gpus: int, namespace: str, cls: str) -> Json:
    """A GPU pod for the real server: the Priority admission plugin sets its priority from
    the PriorityClass `cls`; its status is the server's."""
    doc = gpu_pod(name, node_name, gpus, namespace=namespace)
    doc["spec"].pop("priority")
    doc["spec"]["priorityClassName"] = cls
    doc.pop("status")
    return doc


def priority_class(name: str, value: int) -> Json:
    meta = {"name": name}
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": meta,
        "value": value,
    }


def unschedulable(since: str, message: str = "") -> Json:
    """The PodScheduled condition kube-scheduler leaves on a pod it cannot place."""
    return {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
        "lastTransitionTime": since,
    }


def deployment(name: str, namespace: str, replicas: int, app: str = "") -> Json:
    """A Deployment of `replicas` pods labelled app=`app` or NAME (they need no GPU)."""
    labels = {"app": app or name}
    template = {
        "metadata": {"labels": labels},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": template},
    }
