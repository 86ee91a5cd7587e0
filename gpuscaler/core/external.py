"""The replica floor through KEDA's own extension point, and when a floor may be patched.

KEDA's External Scaler (kedacore/keda `pkg/scalers/externalscaler/externalscaler.proto`)
asks four things about a ScaledObject; how KEDA uses the answers is in
`pkg/scalers/external_scaler.go`:
- `GetMetricSpec` gives the metric's name and target. KEDA makes it an External metric of
  the HPA it owns, type AverageValue unless the trigger sets `metricType`
  (`GetMetricTargetType`, `pkg/scalers/scaler.go`), target `targetSizeFloat`.
- `GetMetrics` gives the value; KEDA reads `metricValueFloat` when it is > 0, else the
  integer `metricValue` (`GetMetricsAndActivity`). The HPA wants ceil(value / target)
  replicas for an AverageValue metric, and takes the max over all the ScaledObject's
  metrics. So gpuscaler answers target 1 and value = the floor: the HPA wants at least
  the floor, and the user's reactive triggers keep the ceiling.
- `IsActive` (and `StreamIsActive` for `external-push`): KEDA calls it right after
  `GetMetrics`; a ScaledObject is active when any trigger is, and only then is it scaled
  up from zero; when none has been for `cooldownPeriod`, it goes to minReplicaCount.

No fresh forecast (none yet, stale or invalid input, the skill check fell back, dry run,
or the controller stopped ticking): the floor answer is 0 and IsActive false. A 0 asks the
HPA for no replicas, so the max over triggers is the reactive triggers' own answer, and an
inactive trigger leaves activity to the others. An error would be worse: the HPA will not
scale down while one of its metrics fails (it would pin the workload up).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from gpuscaler.core.decisions import target_key
from gpuscaler.core.model import Plan, Snapshot
from gpuscaler.core.parsing import parse_count, shown

METRIC_NAME: Final = "gpuscaler-replica-floor"
"""The metric gpuscaler names in GetMetricSpec; KEDA prefixes it with `s<trigger index>-`
for the HPA and removes the prefix before asking GetMetrics."""
TARGET_SIZE: Final = 1.0
"""One floor unit per replica: ceil(floor / 1) = floor."""

KEDA_METADATA: Final = frozenset(
    {"scalerAddress", "enableTLS", "unsafeSsl", "caCert", "tlsClientCert", "tlsClientKey"}
)
"""Trigger metadata KEDA itself reads (externalScalerMetadata in external_scaler.go); KEDA
passes the whole trigger metadata on, so these arrive too."""
ACTIVATION_FLOOR: Final = "activationFloor"
"""gpuscaler's one metadata key: the floor at or above which IsActive says true
(default 1: active whenever the forecast asks for a replica)."""
KNOWN_METADATA: Final = KEDA_METADATA | {ACTIVATION_FLOOR}

EXTERNAL_TRIGGERS: Final = ("external", "external-push")

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""Matched whole (`fullmatch`: `$` would also match before a trailing newline)."""


@dataclass(frozen=True)
class FloorEntry:
    """What the controller's latest tick says about one workload's floor."""

    floor: int
    """The floor the controller holds (decided this tick, or kept)."""
    fresh: bool
    """Backed by a fresh, trusted forecast: only then is it served."""
    reason: str
    at: float
    """Time of the tick it came from (unix seconds)."""


@dataclass(frozen=True)
class Answer:
    value: int
    """The metric value for GetMetrics: the floor, or 0 to leave the reactive triggers
    in charge."""
    active: bool
    reason: str


@dataclass(frozen=True)
class ScalerRequest:
    """A request's ScaledObjectRef, checked: the workload key and the activation floor."""

    key: str
    activation: int


def check_request(name: str, namespace: str, metadata: Mapping[str, str]) -> ScalerRequest:
    """The request as gpuscaler reads it; ValueError naming what is malformed."""
    if not _DNS_LABEL.fullmatch(namespace):
        raise ValueError(f"scaledObjectRef.namespace {shown(namespace)} is not a namespace name")
    if not _DNS_SUBDOMAIN.fullmatch(name):
        raise ValueError(f"scaledObjectRef.name {shown(name)} is not a ScaledObject name")
    where = f"ScaledObject {namespace}/{name}"
    for key in sorted(metadata):
        base = key.removesuffix("FromEnv")  # KEDA resolves xFromEnv, keeping the key
        if base not in KNOWN_METADATA:
            raise ValueError(
                f"{where}: trigger metadata {shown(key)} is not known to gpuscaler (known: "
                f"{', '.join(sorted(KNOWN_METADATA))})"
            )
    activation = 1
    raw = metadata.get(ACTIVATION_FLOOR, metadata.get(ACTIVATION_FLOOR + "FromEnv"))
    if raw is not None:
        try:
            activation = parse_count(raw)
        except ValueError as e:
            raise ValueError(f"{where}: trigger metadata {ACTIVATION_FLOOR}={e}") from None
        if activation < 1:
            raise ValueError(
                f"{where}: trigger metadata {ACTIVATION_FLOOR}={shown(raw)} must be at least 1"
            )
    return ScalerRequest(f"{namespace}/ScaledObject/{name}", activation)


def check_metric_name(name: str, key: str) -> None:
    """GetMetrics asks for the metric GetMetricSpec named; ValueError otherwise."""
    if name != METRIC_NAME:
        raise ValueError(
            f"{key}: metric {shown(name)} is not gpuscaler's (it serves {METRIC_NAME!r} only)"
        )


def answer(entry: FloorEntry | None, now: float, max_age: float, activation: int = 1) -> Answer:
    """The floor to serve, and whether the trigger is active, as of `now`."""
    neutral = "the reactive triggers decide"
    if entry is None:
        return Answer(0, False, f"no tick has planned this workload yet: {neutral}")
    age = now - entry.at
    if age > max_age:
        return Answer(
            0,
            False,
            f"no fresh forecast: the last plan is {age:.0f}s old (limit {max_age:.0f}s): {neutral}",
        )
    if not entry.fresh:
        return Answer(0, False, f"{entry.reason}: {neutral}")
    active = entry.floor >= activation
    return Answer(entry.floor, active, f"floor {entry.floor}: {entry.reason}")


def floor_entries(
    plan: Plan, snapshot: Snapshot, keys: Iterable[str], serving: str | None
) -> dict[str, FloorEntry]:
    """Per workload in `keys`, what its floor is after this plan. `serving` is None when
    the floors may be served, else why not (dry run)."""
    decisions = {d.target: d for d in plan.decisions if d.kind == "replica_floor"}
    skips = {s.target: s for s in plan.skips if s.kind == "replica_floor"}
    floors = {w.key: w.floor for w in snapshot.workloads}
    out = {}
    for key in keys:
        decision, skip = decisions.get(key), skips.get(key)
        floor = floors.get(key)
        if decision is not None:
            floor, reason = int(decision.to_value), decision.reason
        elif skip is not None:
            reason = skip.reason
        else:
            reason = "not planned this tick"
        # Decided this tick, or held on trusted input: fresh. Invalid input: not.
        fresh = floor is not None and (
            decision is not None or (skip is not None and not skip.invalid_input)
        )
        if plan.history.get(target_key("replica_floor", key)).fallback:
            fresh, reason = False, "skill fallback: the forecast has had no skill lately"
        if serving is not None:
            fresh, reason = False, serving
        out[key] = FloorEntry(floor or 0, fresh, reason, plan.time)
    return out


def gpuscaler_trigger(addresses: Iterable[str], service_names: Iterable[str]) -> bool:
    """Whether one of a ScaledObject's external triggers points at gpuscaler: the host of
    its scalerAddress (`host:port`) starts with one of `service_names` as a DNS label."""
    names = tuple(service_names)
    for address in addresses:
        host = address.strip().rsplit(":", 1)[0] if ":" in address else address.strip()
        first = host.split(".", 1)[0].lower()
        if first in names:
            return True
    return False
