"""The replica floor through KEDA's External Scaler (kedacore/keda
`pkg/scalers/external_scaler.go`).

KEDA makes the metric of `GetMetricSpec` an AverageValue External metric of its HPA, which
wants ceil(value / target) replicas and takes the max over the ScaledObject's triggers: so
gpuscaler answers target 1 and value = the floor, and the user's triggers keep the
ceiling. `IsActive` (`StreamIsActive` for `external-push`) decides scaling from zero.
Without a fresh forecast (none yet, invalid input, skill fallback, dry run, a stopped
controller) the answer is 0 and inactive, leaving the reactive triggers in charge; an
error would be worse: the HPA will not scale down while one of its metrics fails.
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
TARGET_SIZE: Final = 1.0
"""One floor unit per replica: ceil(floor / 1) = floor."""

KEDA_METADATA: Final = frozenset(
    {"scalerAddress", "enableTLS", "unsafeSsl", "caCert", "tlsClientCert", "tlsClientKey"}
)
"""Trigger metadata KEDA itself reads, passed on with the rest."""
ACTIVATION_FLOOR: Final = "activationFloor"
"""gpuscaler's one metadata key: the floor at or above which IsActive says true (1)."""
KNOWN_METADATA: Final = KEDA_METADATA | {ACTIVATION_FLOOR}

EXTERNAL_TRIGGERS: Final = ("external", "external-push")

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""Matched whole (`fullmatch`: `$` would also match before a trailing newline)."""


@dataclass(frozen=True)
class FloorEntry:
    """The floor the controller's latest tick (at `at`) holds for one workload; only a
    `fresh` one (backed by a trusted forecast) is served."""

    floor: int
    fresh: bool
    reason: str
    at: float


@dataclass(frozen=True)
class Answer:
    value: int
    """GetMetrics' value: the floor, or 0 to leave the reactive triggers in charge."""
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
        why = f"no fresh forecast: the last plan is {age:.0f}s old (limit {max_age:.0f}s)"
        return Answer(0, False, f"{why}: {neutral}")
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
    hosts = (a.strip().rsplit(":", 1)[0] if ":" in a else a.strip() for a in addresses)
    return any(host.split(".", 1)[0].lower() in names for host in hosts)
