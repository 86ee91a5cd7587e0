"""The extender's memory: the GPU-info cache and the reservation ledger.

- GPU info: per node the measured GPUs (one grouped Prometheus query per refresh), with
  NUMA from the node's topology annotation (or the GPUs-per-NUMA label), refreshed every
  TTL by a background thread. A node missing from a refresh keeps its last state; its age
  grows until it is scored from that state (up to 3 TTLs) and then filtered as stale.
- Reservations: keyed by pod UID, rebuilt from pod annotations at every refresh (so a
  restart loses nothing), dropped when the pod is gone or done, expired when measured
  memory shows the pod or after their TTL.
- Node views (what Filter and Score read) are recomputed for a node when its data or its
  reservations change, and swapped in whole: the verbs never see a half-built state.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from gpuscaler.core.gpufit import (
    AnnotationError,
    NodeGpus,
    NodeMeta,
    NodeView,
    PodRecord,
    Reservation,
    node_view,
    numa_map,
    reservation_expiry,
    reservation_from_pod,
    with_numa,
    with_reservations,
)
from gpuscaler.core.gputable import NodeTable, node_table

log = logging.getLogger("gpuscaler.extender")

FORGET_AFTER = 600.0
"""Seconds after which the last GPU state of a node that no longer exists is dropped."""
LISTING_GRACE = 30.0
"""Seconds an in-memory reservation outlives its absence from a pod listing: longer than
any bind (annotate + Binding, each call bounded by a 10 s timeout)."""


class GpuSource(Protocol):
    def fetch(self) -> dict[str, NodeGpus]: ...


class ClusterSource(Protocol):
    def nodes(self) -> dict[str, NodeMeta]: ...

    def pods(self) -> list[PodRecord]: ...


@dataclass(frozen=True)
class Snapshot:
    """One consistent state for the verbs."""

    gpus: dict[str, NodeGpus] = field(default_factory=dict)
    """Measured GPUs with NUMA, reservations not applied."""
    views: dict[str, NodeView] = field(default_factory=dict)
    """With reservations counted as used."""
    meta: dict[str, NodeMeta] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)
    """Nodes whose annotations cannot be read: the sentence naming the annotation."""
    largest_total: float | None = None
    table: NodeTable = field(default_factory=lambda: node_table({}))
    """The views as arrays, for the verbs' many-node questions."""


class GpuState:
    """Cache + ledger; `refresh` is called every TTL, the verbs read `snapshot`."""

    def __init__(
        self,
        gpus: GpuSource,
        cluster: ClusterSource,
        margin: float,
        reservation_ttl: float,
        clock: Callable[[], float],
    ):
        self.gpu_source = gpus
        self.cluster = cluster
        self.margin = margin
        self.reservation_ttl = reservation_ttl
        self.clock = clock
        self.snapshot = Snapshot()
        self.reservations: dict[str, Reservation] = {}
        self._measured: dict[str, NodeGpus] = {}
        self._lock = threading.Lock()  # guards the ledger and snapshot swaps
        self._node_locks: dict[str, threading.Lock] = {}
        self.pod_uids: set[str] | None = None
        """UIDs of the GPU scheduler's pods at the last listing."""
        self.last_error: str | None = None
        self.refreshed_at: float | None = None

    def node_lock(self, node: str) -> threading.Lock:
        with self._lock:
            return self._node_locks.setdefault(node, threading.Lock())

    def refresh(self) -> None:
        """Read GPUs (one query), nodes and pods; rebuild the ledger and the views. A
        failing source keeps what was known; the error is kept for /readyz and logs."""
        errors = []
        try:
            self._measured.update(self.gpu_source.fetch())
        except Exception as e:  # an adapter error: keep the last state, ages grow
            errors.append(f"GPU metrics: {e}")
        listed_at = self.clock()
        meta, pods = self.snapshot.meta, None
        try:
            meta = self.cluster.nodes()
            pods = self.cluster.pods()
        except Exception as e:
            errors.append(f"Kubernetes: {e}")
        with self._lock:
            if pods is not None:
                self._rebuild_ledger(pods, listed_at)
                self.pod_uids = {p.uid for p in pods}
            self._expire(self.clock())
            self.snapshot = self._build(meta)
        self.last_error = "; ".join(errors) or None
        if errors:
            log.warning("extender refresh: %s", self.last_error, extra={"event": "refresh_failed"})
        else:
            self.refreshed_at = self.clock()

    def _rebuild_ledger(self, pods: list[PodRecord], listed_at: float) -> None:
        rebuilt: dict[str, Reservation] = {}
        for p in pods:
            if p.assumed_at is None or p.phase in ("Succeeded", "Failed"):
                continue
            try:
                r = reservation_from_pod(p.uid, p.namespace, p.name, p.annotations, p.assumed_at)
            except AnnotationError as e:
                log.warning("pod %s/%s: %s", p.namespace, p.name, e)
                continue
            if r is not None:
                rebuilt[r.uid] = r
        for uid, r in self.reservations.items():
            # a bind in flight while the listing ran may be missing from it: kept a little
            # longer (a deleted pod's memory stays reserved for LISTING_GRACE at most)
            if uid not in rebuilt and listed_at - r.assumed_at < LISTING_GRACE:
                rebuilt[uid] = r
        self.reservations = rebuilt

    def _expire(self, now: float) -> None:
        for uid, r in list(self.reservations.items()):
            why = reservation_expiry(r, self._measured.get(r.node), now, self.reservation_ttl)
            if why is not None:
                log.info(
                    "reservation of pod %s/%s on %s ended: %s",
                    r.namespace,
                    r.name,
                    r.node,
                    why,
                    extra={"event": "reservation_ended", "uid": uid, "why": why},
                )
                del self.reservations[uid]

    def _build(self, meta: dict[str, NodeMeta]) -> Snapshot:
        now = self.clock()
        for name, n in list(self._measured.items()):  # a deleted node, long silent: forget it
            if meta and name not in meta and now - n.sampled_at > FORGET_AFTER:
                del self._measured[name]
        gpus: dict[str, NodeGpus] = {}
        problems: dict[str, str] = {}
        for name, measured in self._measured.items():
            m = meta.get(name, NodeMeta(name))
            try:
                numa = numa_map(m.topology, m.gpus_per_numa, measured.gpus)
            except AnnotationError as e:
                problems[name] = str(e)
                continue
            gpus[name] = with_numa(measured, numa)
        by_node: dict[str, list[Reservation]] = {}
        for r in self.reservations.values():
            by_node.setdefault(r.node, []).append(r)
        views = {
            name: node_view(with_reservations(n, by_node.get(name, ())), self.margin)
            for name, n in gpus.items()
        }
        largest = max((v.total_mib for v in views.values()), default=None)
        return Snapshot(gpus, views, meta, problems, largest, node_table(views))

    def reservations_on(self, node: str) -> list[Reservation]:
        with self._lock:
            return [r for r in self.reservations.values() if r.node == node]

    def reserve(self, r: Reservation) -> None:
        with self._lock:
            self.reservations[r.uid] = r
            self._rebuild_view(r.node)

    def release(self, uid: str) -> None:
        with self._lock:
            r = self.reservations.pop(uid, None)
            if r is not None:
                self._rebuild_view(r.node)

    def _rebuild_view(self, node: str) -> None:
        snap = self.snapshot
        if node not in snap.gpus:
            return
        mine = [r for r in self.reservations.values() if r.node == node]
        view = node_view(with_reservations(snap.gpus[node], mine), self.margin)
        views = snap.views | {node: view}
        self.snapshot = replace(snap, views=views, table=node_table(views))
