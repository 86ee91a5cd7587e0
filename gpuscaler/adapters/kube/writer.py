"""The one gate every write passes: only opted-in objects, nothing written when the
value is there, each patch with the resourceVersion read (a 409 re-read and retried at
most `MAX_CONFLICT_RETRIES` times), value and decision annotation in one patch with an
Event, and every write spending from one `WriteBudget` after asking `may_act` (a replica
that lost its lease stops between two writes).
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpuscaler.adapters.kube.api import KubeError, api_error
from gpuscaler.config import Config, WorkloadConfig
from gpuscaler.core.decisions import Decision

log = logging.getLogger("gpuscaler.kubernetes")

MAX_CONFLICT_RETRIES = 3
"""Three fresh reads settle any ordinary race without spinning."""
REPORTING_CONTROLLER = "gpuscaler.io/controller"


class WriteBudget:
    """At most `per_minute` writes in any 60 s; `take` says whether one more may go."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic):
        self.per_minute = per_minute
        self.clock = clock
        self._times: deque[float] = deque()

    def take(self) -> bool:
        now = self.clock()
        while self._times and now - self._times[0] >= 60:
            self._times.popleft()
        if len(self._times) >= self.per_minute:
            return False
        self._times.append(now)
        return True


class Writer:
    """The write gate (leadership and budget) and Events, shared by every actuator."""

    def __init__(
        self,
        api: client.ApiClient,
        config: Config,
        identity: str,
        budget: WriteBudget | None = None,
        may_act: Callable[[], bool] = lambda: True,
    ):
        self.config = config
        self.events = client.EventsV1Api(api)
        self.identity = identity
        self.budget = budget or WriteBudget(config.kubernetes.max_writes_per_minute)
        self.may_act = may_act

    def gate(self, what: str) -> None:
        """Raise unless one more write may go now."""
        if not self.may_act():
            raise KubeError(f"{what}: not the leader (lease lost or not held); not written")
        if not self.budget.take():
            raise KubeError(
                f"{what}: write budget spent ({self.budget.per_minute}/min); retried next tick"
            )

    def event(
        self,
        regarding: client.V1ObjectReference,
        namespace: str,
        reason: str,
        action: str,
        note: str,
        type_: str = "Normal",
    ) -> None:
        event = client.EventsV1Event(
            # Named as client-go's recorder names them (tools/events/event_recorder.go:
            # "<object>.<unix nanoseconds in hex>"); a generateName may not end in ".".
            metadata=client.V1ObjectMeta(
                name=f"{regarding.name}.{time.time_ns():x}", namespace=namespace
            ),
            event_time=datetime.now(UTC),
            reason=reason,
            action=action,
            note=note[:1024],
            type=type_,
            reporting_controller=REPORTING_CONTROLLER,
            reporting_instance=self.identity,
            regarding=regarding,
        )
        try:
            self.events.create_namespaced_event(namespace, event, _preload_content=False)
        except ApiException as e:  # the change is made; a lost Event is logged, not fatal
            log.warning("%s", api_error(f"event {reason} on {regarding.name} not recorded", e))


def decision_record(d: Decision) -> str:
    return json.dumps(d.as_record())


def scale_object_ref(w: WorkloadConfig, uid: str | None) -> client.V1ObjectReference:
    """The ScaledObject or HPA of `w` as an Event's `regarding` (its uid: `kubectl
    describe` shows the Event)."""
    return client.V1ObjectReference(
        api_version="keda.sh/v1alpha1" if w.kind == "ScaledObject" else "autoscaling/v2",
        kind=w.kind,
        name=w.name,
        namespace=w.namespace,
        uid=uid or None,
    )
