"""Kubernetes adapter of the node agent: its own Node and the pods bound to it.

Built on `gpuscaler.adapters.kube` (JSON objects, `KubeError`, the `Writer`'s gate
and Events) and its bounded API client (`gpuscaler.adapters.kube.api`: timeouts on every
call, a time budget per poll, a transport failure an `ApiException`). Every patch carries
the resourceVersion read, and a 409 re-reads (at most `MAX_CONFLICT_RETRIES` times).

What the agent may touch (deploy/agent/rbac.yaml): get and patch Nodes (its own: an
admission policy compares the node with the one its token is bound to), list pods (only
with the field selector `spec.nodeName=<its node>`), create Events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.adapters.kube.api import KubeError, api_error, json_body, read_json
from gpuscaler.adapters.kube.preemption_records import QUARANTINE_TAINT
from gpuscaler.adapters.kube.writer import MAX_CONFLICT_RETRIES, WriteBudget, Writer
from gpuscaler.config import Config
from gpuscaler.core.gpufit import TOPOLOGY_ANNOTATION

TIME_SLICE_APPLIED = "gpuscaler.io/time-slice-applied"
"""Node annotation: the time-slice level the agent applied to every GPU that takes one."""
GPU_TOPOLOGY = TOPOLOGY_ANNOTATION
CLEANUP_LABEL = "gpuscaler.io/gpu-cleanup"
"""Set to `required` with the quarantine taint by preemption tier 3."""
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
"""A static pod's mirror carries the UID its cgroup is named after here."""


@dataclass(frozen=True)
class NodeView:
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    taints: list[dict[str, Any]]
    resource_version: str | None
    uid: str | None = None

    @property
    def quarantined(self) -> bool:
        return CLEANUP_LABEL in self.labels or any(
            t.get("key") == QUARANTINE_TAINT for t in self.taints
        )


def _node_view(doc: dict[str, Any]) -> NodeView:
    meta = doc.get("metadata") or {}
    return NodeView(
        name=str(meta.get("name")),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        taints=list((doc.get("spec") or {}).get("taints") or []),
        resource_version=meta.get("resourceVersion"),
        uid=meta.get("uid"),
    )


class NodeApi:
    """The agent's calls, all about one node."""

    def __init__(self, api: client.ApiClient, config: Config, node: str, identity: str):
        self.config = config
        self.node = node
        self.core = client.CoreV1Api(api)
        self.uid: str | None = None
        """The node's uid once read: Events name it, so `kubectl describe node` shows them."""
        self.writer = Writer(
            api, config, identity, WriteBudget(config.kubernetes.max_writes_per_minute)
        )

    def read(self) -> NodeView:
        view = _node_view(
            read_json(
                f"read node {self.node}",
                lambda: self.core.read_node(self.node, _preload_content=False),
            )
        )
        self.uid = view.uid or self.uid
        return view

    def pods(self) -> dict[str, frozenset[str]]:
        """Every pod the API lists on this node (Terminating ones included: their processes
        are still the pod's), "namespace/name" -> its UID and a static pod's config UID. A
        consistent read (no resourceVersion): never an older cache's answer."""
        doc = read_json(
            f"list pods on node {self.node}",
            lambda: self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node}",
                _preload_content=False,
            ),
        )
        pods: dict[str, frozenset[str]] = {}
        for pod in doc.get("items") or []:
            meta = pod.get("metadata") or {}
            name = f"{meta.get('namespace')}/{meta.get('name')}"
            mirror = (meta.get("annotations") or {}).get(MIRROR_ANNOTATION)
            pods[name] = frozenset(str(v) for v in (meta.get("uid"), mirror) if v)
        return pods

    def _patch(self, what: str, body_for: Callable[[NodeView], dict[str, Any]]) -> NodeView:
        """Patch the node with the body `body_for(current)` builds (resourceVersion added);
        on 409 re-read and rebuild. Returns the node as written."""
        node = self.read()
        for _ in range(MAX_CONFLICT_RETRIES + 1):
            body = body_for(node)
            body.setdefault("metadata", {})["resourceVersion"] = node.resource_version
            self.writer.gate(f"{what} on node {self.node}")
            try:
                doc = json_body(self.core.patch_node(self.node, body, _preload_content=False))
                return _node_view(doc)
            except ApiException as e:
                if e.status != 409:
                    raise api_error(f"{what} on node {self.node}", e) from None
            node = self.read()
        raise KubeError(f"{what} on node {self.node}: still conflicting")

    def annotate(self, values: dict[str, str]) -> NodeView:
        return self._patch("annotate", lambda _node: {"metadata": {"annotations": values}})

    def lift_quarantine(self) -> NodeView:
        """Remove the `gpu-memory-held` taint and the cleanup label, in one patch."""

        def body(node: NodeView) -> dict[str, Any]:
            taints = [t for t in node.taints if t.get("key") != QUARANTINE_TAINT]
            return {"metadata": {"labels": {CLEANUP_LABEL: None}}, "spec": {"taints": taints}}

        return self._patch("lift quarantine", body)

    def event(self, reason: str, action: str, note: str, type_: str = "Normal") -> None:
        """An Event on the node; a lost Event is logged, never fatal."""
        self.writer.event(
            client.V1ObjectReference(api_version="v1", kind="Node", name=self.node, uid=self.uid),
            self.config.kubernetes.events_namespace,
            reason,
            action,
            note,
            type_,
        )
