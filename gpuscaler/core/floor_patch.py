"""Whether gpuscaler may patch a replica floor into a ScaledObject's or HPA's spec.

Patching is the fallback for plain HPAs (and ScaledObjects without gpuscaler's external
trigger). It stands back, with the reason, when another party owns the field:
- KEDA's pause annotations (kedacore/keda `apis/keda/v1alpha1/scaledobject_types.go`:
  `autoscaling.keda.sh/paused` and `paused-replicas` pause the ScaledObject, with KEDA's
  reading: `paused` counts when it parses as true or does not parse at all,
  `paused-replicas` whenever present; `paused-scale-in` / `paused-scale-out` block moves in
  that direction);
- a GitOps tool: one of its field managers owns the floor field (managedFields), or the
  object carries its tracking marker (Argo CD's `argocd.argoproj.io/tracking-id`
  annotation, Flux's `kustomize.toolkit.fluxcd.io/name` / `helm.toolkit.fluxcd.io/name`
  labels) or `gpuscaler.io/gitops-owned: "true"`. A marker alone is overridden by
  `gpuscaler.io/gitops-owned: "false"` (for a tool told to ignore the field); ownership
  of the field itself is not;
- gpuscaler's own external trigger on the ScaledObject: its floor is served, not patched.
"""

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
    v = value.strip()
    if v in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    return v not in ("0", "f", "F", "FALSE", "false", "False")


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
