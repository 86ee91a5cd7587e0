"""What a ScaledObject's or HPA's JSON says about who owns its floor (pure reading).

`floor_managers`: the field managers whose managedFields entry holds the floor field
(`fieldsV1` `f:spec` -> `f:minReplicaCount` / `f:minReplicas`), as the API server records
server-side apply and updates (k8s.io/apimachinery `pkg/apis/meta/v1/types.go`,
ManagedFieldsEntry). `external_addresses`: the scalerAddress of each `external` /
`external-push` trigger (kedacore/keda `pkg/scalers/external_scaler.go`).
"""

from __future__ import annotations

from typing import Any

from gpuscaler.core.external import EXTERNAL_TRIGGERS

Json = dict[str, Any]


def floor_field(kind: str) -> str:
    return "minReplicaCount" if kind == "ScaledObject" else "minReplicas"


def floor_managers(meta: Json, kind: str) -> tuple[str, ...]:
    """Anything of another shape than the API server writes counts as no owner."""
    want = "f:" + floor_field(kind)
    found = []
    entries = meta.get("managedFields")
    for entry in entries if isinstance(entries, list) else []:
        fields = entry.get("fieldsV1") if isinstance(entry, dict) else None
        spec = fields.get("f:spec") if isinstance(fields, dict) else None
        if isinstance(spec, dict) and want in spec:
            found.append(str(entry.get("manager", "")))
    return tuple(found)


def external_addresses(spec: Json) -> tuple[str, ...]:
    out = []
    triggers = spec.get("triggers")
    for trigger in triggers if isinstance(triggers, list) else []:
        if isinstance(trigger, dict) and trigger.get("type") in EXTERNAL_TRIGGERS:
            metadata = trigger.get("metadata")
            if isinstance(metadata, dict):
                out.append(str(metadata.get("scalerAddress", "")))
    return tuple(out)


def trigger_count(spec: Json) -> int:
    triggers = spec.get("triggers")
    return len(triggers) if isinstance(triggers, list) else 0
