"""Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does.

Expiry is judged by the local clock: a standby takes over only after the Lease's record
stayed unchanged for `duration`. The leader acts only while its last renewal is younger
than `renew_deadline` (< `duration`), so it stops before anyone may take over. Every write
carries the resourceVersion read (two racing replicas cannot both win); a clean shutdown
releases the Lease.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.config import LeaseConfig

log = logging.getLogger("gpuscaler.leader")


class LeaderElector:
    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        identity: str,
        cfg: LeaseConfig,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ):
        self.coordination = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = cfg.name
        self._where = f"{namespace}/{cfg.name}"
        self.identity = identity
        self.cfg = cfg
        self.clock = clock
        self.wall = wall
        self._renewed_at: float | None = None
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._was_leader = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def is_leader(self) -> bool:
        """True while the last successful renewal is younger than renew_deadline."""
        return (
            self._renewed_at is not None
            and self.clock() - self._renewed_at < self.cfg.renew_deadline
        )

    def _report(self) -> bool:
        leader = self.is_leader()
        if leader != self._was_leader:
            what = "acquired" if leader else "lost"
            extra = {"event": "leader" if leader else "standby", "identity": self.identity}
            log.info("%s leadership of lease %s", what, self._where, extra=extra)
            self._was_leader = leader
        return leader

    def _lease(self, previous: client.V1Lease | None) -> client.V1Lease:
        """The Lease naming this replica holder, renewed now."""
        now = self.wall()
        prev = previous.spec if previous is not None and previous.spec is not None else None
        ours = prev is not None and prev.holder_identity == self.identity
        transitions = (prev.lease_transitions or 0) if prev is not None else 0
        return client.V1Lease(
            api_version="coordination.k8s.io/v1",
            kind="Lease",
            metadata=client.V1ObjectMeta(
                name=self.name,
                namespace=self.namespace,
                resource_version=previous.metadata.resource_version
                if previous is not None and previous.metadata is not None
                else None,
            ),
            spec=client.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=max(1, round(self.cfg.duration)),
                acquire_time=prev.acquire_time if ours and prev is not None else now,
                renew_time=now,
                lease_transitions=transitions if ours or prev is None else transitions + 1,
            ),
        )

    def step(self) -> bool:
        """Try once to acquire or renew; returns whether this replica may act."""
        now = self.clock()
        try:
            lease = self.coordination.read_namespaced_lease(self.name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                log.warning("lease %s: read failed: HTTP %s", self._where, e.status)
                return self._report()
            return self._write(now, None)
        spec = lease.spec or client.V1LeaseSpec()
        record = (
            spec.holder_identity,
            spec.renew_time,
            spec.lease_duration_seconds,
            spec.lease_transitions,
        )
        if record != self._observed:
            self._observed, self._observed_at = record, now
        holder = spec.holder_identity
        duration = float(spec.lease_duration_seconds or self.cfg.duration)
        if holder and holder != self.identity and now < self._observed_at + duration:
            self._renewed_at = None  # someone else holds a live lease
            return self._report()
        return self._write(now, lease)

    def _write(self, now: float, previous: client.V1Lease | None) -> bool:
        """Create or replace the Lease with this replica as holder; a 409 means another
        replica wrote first."""
        try:
            lease = self._lease(previous)
            if previous is None:
                self.coordination.create_namespaced_lease(self.namespace, lease)
            else:
                self.coordination.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as e:
            if e.status != 409:
                log.warning("lease %s: write failed: HTTP %s", self._where, e.status)
            return self._report()
        self._renewed_at = now
        self._observed = None
        return self._report()

    def release(self) -> None:
        """Give the lease up (clean shutdown) so a standby takes over without waiting."""
        if not self.is_leader():
            return
        self._renewed_at = None
        try:
            lease = self.coordination.read_namespaced_lease(self.name, self.namespace)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            lease.spec.renew_time = self.wall()
            self.coordination.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as e:
            log.warning("lease %s: release failed: HTTP %s", self._where, e.status)
        self._report()

    def start(self) -> None:
        """Renew (or try) every retry_period in a daemon thread."""

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.step()
                except Exception:  # never let the thread die: not renewing = not acting
                    log.exception("lease step failed")
                self._stop.wait(self.cfg.retry_period)

        self._thread = threading.Thread(target=loop, daemon=True, name="leader-election")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.cfg.retry_period + 5)
        self.release()
