"""The floors the external scaler serves: the controller's latest plan, per ScaledObject.

Filled by a listener on every tick (leader or standby) and read by the gRPC threads, so
every access holds one lock. Which ScaledObjects are served, never patched, is read from
the cluster each tick: those with an external trigger pointing at gpuscaler.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gpuscaler.adapters.kube.objects import ClusterObjects, CurrentState
from gpuscaler.config import Config
from gpuscaler.core.decisions import Decision
from gpuscaler.core.external import FloorEntry, floor_entries, gpuscaler_trigger

if TYPE_CHECKING:
    from gpuscaler.controller import TickResult

log = logging.getLogger("gpuscaler.extscaler")

DRY_RUN = "dry run: gpuscaler plans only"


class FloorBoard:
    def __init__(self, config: Callable[[], Config], clock: Callable[[], float] = time.time):
        self.config = config
        """The controller's config now (it is reloaded)."""
        self.clock = clock
        self._lock = threading.Condition()
        self._entries: dict[str, FloorEntry] = {}
        self._external: frozenset[str] = frozenset()
        self._version = 0

    def max_age(self) -> float:
        cfg = self.config()
        return cfg.external_scaler.max_age or 3 * cfg.control.interval

    def lookup(self, key: str) -> tuple[bool, FloorEntry | None]:
        """(whether gpuscaler manages the ScaledObject `key`, its latest entry)."""
        managed = any(w.key == key for w in self.config().workloads)
        with self._lock:
            return managed, self._entries.get(key)

    def external(self) -> frozenset[str]:
        with self._lock:
            return self._external

    def see(self, objects: ClusterObjects | None) -> None:
        """Note which ScaledObjects carry gpuscaler's external trigger."""
        if objects is None:
            return
        names = self.config().external_scaler.service_names
        found = frozenset(
            key
            for key, so in objects.scale_objects.items()
            if "/ScaledObject/" in key and gpuscaler_trigger(so.external_addresses, names)
        )
        with self._lock:
            if found != self._external:
                log.info(
                    "served through the external scaler, not patched: %s",
                    ", ".join(sorted(found)) or "none",
                    extra={"event": "external_scaler_workloads", "workloads": sorted(found)},
                )
                self._warn_alone(objects, found - self._external)
            self._external = found

    @staticmethod
    def _warn_alone(objects: ClusterObjects, keys: frozenset[str]) -> None:
        """A ScaledObject whose only triggers are gpuscaler's has no reactive trigger to
        fall back on: without a fresh forecast KEDA would take it to minReplicaCount."""
        for key in sorted(keys):
            so = objects.scale_objects[key]
            if so.triggers <= len(so.external_addresses):
                log.warning(
                    "%s has no trigger but gpuscaler's: while gpuscaler has no fresh "
                    "forecast (an outage) KEDA sees it inactive and takes it to "
                    "minReplicaCount; add the reactive trigger it should fall back on",
                    key,
                    extra={"event": "external_scaler_alone", "target": key},
                )

    def held_floors(self) -> dict[str, int]:
        """The floor the controller holds for each served ScaledObject: what the core
        takes as the current floor (spec.minReplicaCount is the user's, not gpuscaler's)."""
        with self._lock:
            return {k: e.floor for k, e in self._entries.items() if k in self._external}

    def on_tick(self, result: TickResult) -> None:
        """Record the floors of a tick; a dry run records them as not to be served."""
        keys = [w.key for w in self.config().workloads if w.kind == "ScaledObject"]
        serving = None if result.mode in ("acting", "standby") else DRY_RUN
        entries = floor_entries(result.plan, result.snapshot, keys, serving)
        with self._lock:
            self._entries = entries
            self._version += 1
            self._lock.notify_all()

    def wait(self, version: int, timeout: float) -> int:
        """Block until a tick after `version` (or `timeout`); the version now."""
        with self._lock:
            self._lock.wait_for(lambda: self._version != version, timeout)
            return self._version

    @property
    def version(self) -> int:
        with self._lock:
            return self._version


class ServedFloorActuator:
    """The controller's actuator with served ScaledObjects taken out: their floor
    decisions take effect by being served (the board has them from the plan), so they
    count as applied (cooldowns start) and are never written to the object."""

    def __init__(self, inner: Any, board: FloorBoard):
        self.inner = inner
        self.board = board

    def reconfigure(self, config: Config) -> None:
        reconfigure = getattr(self.inner, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(config)

    def apply(self, decisions: tuple[Decision, ...]) -> tuple[Decision, ...]:
        external = self.board.external()
        served = tuple(d for d in decisions if d.kind == "replica_floor" and d.target in external)
        rest = tuple(d for d in decisions if d not in served)
        for d in served:
            log.info(
                "replica_floor of %s served through the external scaler: %s -> %s",
                d.target,
                d.from_value,
                d.to_value,
                extra={"event": "floor_served", "target": d.target, "to": d.to_value},
            )
        return served + tuple(self.inner.apply(rest))


def served_state(
    read: Callable[[], CurrentState], board: FloorBoard, objects: Callable[[], Any]
) -> Callable[[], CurrentState]:
    """`read` with the floors of served ScaledObjects replaced by the floor the
    controller holds for them."""

    def state() -> CurrentState:
        current = read()
        board.see(objects())
        held: Mapping[str, int] = board.held_floors()
        if not held:
            return current
        return replace(current, floors={**current.floors, **held})

    return state
