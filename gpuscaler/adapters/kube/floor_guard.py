"""Before a floor is patched: may it be? (the decision is `gpuscaler.core.floor_patch`).

A refusal is said once per object and reason, as a Warning Event on the object and a log
line; the decision it refused is logged as not applied with the reason every tick (by
the actuator), so `kubectl describe` shows why the floor stays and the log shows when.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gpuscaler.adapters.kube.writer import scale_object_ref
from gpuscaler.core.floor_patch import FloorTarget, floor_patch_refusal

if TYPE_CHECKING:
    from gpuscaler.adapters.kube.objects import ScaleObject
    from gpuscaler.config import Config, WorkloadConfig

log = logging.getLogger("gpuscaler.kubernetes")


class FloorGuard:
    def __init__(self, writer: Any):
        self.writer = writer
        """`gpuscaler.adapters.kube.writer.Writer`: Events."""
        self._said: dict[str, str] = {}

    def refusal(
        self, config: Config, w: WorkloadConfig, state: ScaleObject, want: int
    ) -> str | None:
        """Why `state`'s floor may not be patched to `want`, or None."""
        target = FloorTarget(
            kind=w.kind,
            labels=state.labels,
            annotations=state.annotations,
            floor_managers=state.floor_managers,
            external_addresses=state.external_addresses,
        )
        direction = (want > state.floor) - (want < state.floor)
        why = floor_patch_refusal(
            target,
            direction,
            config.kubernetes.gitops_field_managers,
            config.external_scaler.service_names,
        )
        if why is None:
            self._said.pop(w.key, None)
            return None
        if self._said.get(w.key) != why:
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
