"""Replica floors: ScaledObject `spec.minReplicaCount` or HPA `spec.minReplicas`, never
above the object's own maximum, and only where `gpuscaler.core.floor_patch` allows it.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from kubernetes import client

from gpuscaler.adapters.kube.api import KubeError, read_json, written
from gpuscaler.adapters.kube.objects import (
    LAST_DECISION,
    OPT_IN_LABEL,
    ScaleObject,
    floor_field,
    parse_scale_object,
)
from gpuscaler.adapters.kube.writer import (
    MAX_CONFLICT_RETRIES,
    Writer,
    decision_record,
    scale_object_ref,
)
from gpuscaler.config import Config, WorkloadConfig
from gpuscaler.core.decisions import ReplicaFloorDecision
from gpuscaler.core.floor_patch import FloorTarget, floor_patch_refusal

log = logging.getLogger("gpuscaler.kubernetes")
SCALE_APIS = {
    "ScaledObject": ("keda.sh", "v1alpha1", "scaledobjects"),
    "HorizontalPodAutoscaler": ("autoscaling", "v2", "horizontalpodautoscalers"),
}
"""(group, version, plural) of each kind of workload object, read and merge-patched as JSON."""


class KubeWorkloads:
    """Reads and sets replica floors of the configured workloads."""

    def __init__(
        self,
        api: client.ApiClient,
        config: Config,
        identity: str = "gpuscaler",
        writer: Writer | None = None,
    ):
        self.config = config
        self.custom = client.CustomObjectsApi(api)
        self.writer = writer or Writer(api, config, identity)
        self._said: dict[str, str] = {}
        """The refusal last said of each workload."""

    def _workload(self, key: str) -> WorkloadConfig:
        for w in self.config.workloads:
            if w.key == key:
                return w
        raise KubeError(f"{key} is not a configured workload")

    def read(self, w: WorkloadConfig) -> ScaleObject:
        group, version, plural = SCALE_APIS[w.kind]
        obj = read_json(
            f"read {w.key}",
            lambda: self.custom.get_namespaced_custom_object(
                group, version, w.namespace, plural, w.name
            ),
        )
        return parse_scale_object({**obj, "metadata": obj.get("metadata") or {}}, w.kind)

    def _patch(self, w: WorkloadConfig, body: dict[str, Any]) -> None:
        group, version, plural = SCALE_APIS[w.kind]
        self.custom.patch_namespaced_custom_object(
            group, version, w.namespace, plural, w.name, body
        )

    def refusal(self, w: WorkloadConfig, state: ScaleObject, want: int) -> str | None:
        """Why `state`'s floor may not be patched to `want` (a KEDA pause, GitOps), or
        None. A refusal is said once per object and reason, as a Warning Event on the
        object and a log line, so `kubectl describe` shows why the floor stays."""
        target = FloorTarget(
            kind=w.kind,
            labels=state.labels,
            annotations=state.annotations,
            floor_managers=state.floor_managers,
            external_addresses=state.external_addresses,
        )
        why = floor_patch_refusal(
            target,
            (want > state.floor) - (want < state.floor),
            self.config.kubernetes.gitops_field_managers,
            self.config.external_scaler.service_names,
        )
        if why is None:
            self._said.pop(w.key, None)
        elif self._said.get(w.key) != why:
            self._said[w.key] = why
            log.warning(
                "floor of %s not patched: %s",
                w.key,
                why,
                extra={"event": "floor_patch_refused", "target": w.key, "reason": why},
            )
            self.writer.event(
                scale_object_ref(w, state.uid),
                w.namespace,
                "FloorPatchRefused",
                "SetReplicaFloor",
                f"floor stays {state.floor} (wanted {want}): {why}",
                type_="Warning",
            )
        return why

    def set_floor(self, decision: ReplicaFloorDecision) -> bool:
        """Set the floor `decision` asks for; True when the object now has it, False when
        refused (not opted in, owned by KEDA, or its maximum now below the floor: the core
        decides again next tick, so the value recorded is always the value written)."""
        w = self._workload(decision.target)
        for _ in range(MAX_CONFLICT_RETRIES + 1):
            state = self.read(w)
            if not state.opted_in:
                why = "owned by KEDA" if state.owned_by_keda else f"no label {OPT_IN_LABEL}=true"
                log.info("not touching %s: %s", w.key, why)
                return False
            want = decision.to_value
            if state.max_replicas is not None and want > state.max_replicas:
                log.warning(
                    "not touching %s: its maximum is now %d, below the floor decided (%d); "
                    "decided again next tick",
                    w.key,
                    state.max_replicas,
                    want,
                )
                return False
            if state.floor == want:
                return True  # idempotent: nothing to write
            refused = self.refusal(w, state, want)
            if refused is not None:
                raise KubeError(f"floor of {w.key} not patched: {refused}")
            self.writer.gate(f"floor of {w.key}")
            body = {
                "metadata": {
                    "resourceVersion": state.resource_version,
                    "annotations": {LAST_DECISION: decision_record(decision)},
                },
                "spec": {floor_field(w.kind): want},
            }
            if not written(f"patch {w.key}", partial(self._patch, w, body)):
                continue  # someone wrote first: read again
            self.writer.event(
                scale_object_ref(w, state.uid),
                w.namespace,
                "ReplicaFloorChanged",
                "SetReplicaFloor",
                f"floor {state.floor} -> {want}: {decision.reason}",
            )
            return True
        raise KubeError(f"patch {w.key}: still conflicting after {MAX_CONFLICT_RETRIES} retries")
