"""Whether gpuscaler may patch a replica floor into a ScaledObject's or HPA's spec (the
fallback where gpuscaler's external trigger does not serve it). It stands back, with the
reason, when another party owns the field: KEDA's pause annotations (read as KEDA reads
them), a GitOps tool (a field manager owning the field, or a tracking marker, which
`gpuscaler.io/gitops-owned: "false"` overrides), or gpuscaler's own external trigger."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from gpuscaler.core.external import gpuscaler_trigger

PAUSED: Final = "autoscaling.keda.sh/paused"
PAUSED_REPLICAS: Final = "autoscaling.keda.sh/paused-replicas"
PAUSED_SCALE_IN: Final = "autoscaling.keda.sh/paused-scale-in"
PAUSED_SCALE_OUT: Final = "autoscaling.keda.sh/paused-scale-out"
GITOPS_OWNED: Final = "gpuscaler.io/gitops-owned"
GITOPS_ANNOTATIONS: Final = ("argocd.argoproj.io/tracking-id",)
GITOPS_LABELS: Final = ("kustomize.toolkit.fluxcd.io/name", "helm.toolkit.fluxcd.io/name")


@dataclass(frozen=True)
class FloorTarget:
    """What decides whether a floor may be patched, read from the object."""

    kind: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    floor_managers: tuple[str, ...] = ()
    """Field managers that own spec.minReplicaCount / spec.minReplicas (managedFields)."""
    external_addresses: tuple[str, ...] = ()
    """scalerAddress of each `external` / `external-push` trigger (ScaledObjects)."""


def _keda_bool(value: str) -> bool:
    """KEDA's getBoolAnnotation: strconv.ParseBool, and true when it does not parse."""
    return value.strip() not in ("0", "f", "F", "FALSE", "false", "False")


def floor_patch_refusal(
    target: FloorTarget,
    direction: int,
    gitops_managers: Iterable[str],
    service_names: Iterable[str],
) -> str | None:
    """Why the floor of `target` may not be patched (moving it by `direction`: +1 up,
    -1 down), or None when it may."""
    a = target.annotations
    if target.kind == "ScaledObject":
        if gpuscaler_trigger(target.external_addresses, service_names):
            return (
                "its trigger type external points at gpuscaler: the floor is served "
                "through KEDA's external scaler, never patched into the spec"
            )
        if PAUSED_REPLICAS in a:
            return f"paused by KEDA ({PAUSED_REPLICAS}={a[PAUSED_REPLICAS]!r})"
        if PAUSED in a and _keda_bool(a[PAUSED]):
            return f"paused by KEDA ({PAUSED}={a[PAUSED]!r})"
        if direction > 0 and PAUSED_SCALE_OUT in a and _keda_bool(a[PAUSED_SCALE_OUT]):
            return f"scale out paused by KEDA ({PAUSED_SCALE_OUT}={a[PAUSED_SCALE_OUT]!r})"
        if direction < 0 and PAUSED_SCALE_IN in a and _keda_bool(a[PAUSED_SCALE_IN]):
            return f"scale in paused by KEDA ({PAUSED_SCALE_IN}={a[PAUSED_SCALE_IN]!r})"
    managers = set(gitops_managers)
    owners = [m for m in target.floor_managers if m in managers]
    if owners:
        return (
            f"the floor field is owned by GitOps field manager {owners[0]!r} "
            "(managedFields): it would put its value back"
        )
    declared = a.get(GITOPS_OWNED, "").strip().lower()
    if declared == "true":
        return f"declared GitOps-owned ({GITOPS_OWNED}=true)"
    if declared != "false":
        markers = [k for k in GITOPS_ANNOTATIONS if k in a]
        markers += [k for k in GITOPS_LABELS if k in target.labels]
        if markers:
            return (
                f"managed by a GitOps tool ({markers[0]} is set); add {GITOPS_OWNED}: "
                '"false" if the tool ignores the floor field'
            )
    return None
