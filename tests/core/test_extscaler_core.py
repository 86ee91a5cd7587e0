"""The pure part of KEDA's external scaler and of floor patching: requests checked,
answers served, floors taken from a plan, patch refusals. KEDA passes the whole trigger
metadata on (`xFromEnv` keys under their name); `autoscaling.keda.sh/paused` counts when
it parses as a true Go bool or does not parse, `paused-replicas` whenever present."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuscaler.core.decisions import Decision, ReplicaFloorDecision, Skip
from gpuscaler.core.external import (
    METRIC_NAME,
    FloorEntry,
    answer,
    check_metric_name,
    check_request,
    floor_entries,
    gpuscaler_trigger,
)
from gpuscaler.core.floor_patch import FloorTarget, floor_patch_refusal
from gpuscaler.core.model import History, Plan, Signal, Snapshot, TargetHistory, WorkloadObservation

KEY = "ml/ScaledObject/chat"
GITOPS = ("argocd-controller", "kustomize-controller", "helm-controller")
NAMES = ("gpuscaler",)


# --------------------------------------------------------------------------- requests


@pytest.mark.parametrize(
    ("name", "namespace", "metadata", "problem"),
    [
        ("chat", "ml", {}, None),
        ("chat", "ml", {"scalerAddress": "gpuscaler.gpuscaler.svc:9095"}, None),
        ("chat", "ml", {"scalerAddress": "x:1", "enableTLS": "false", "unsafeSsl": "true"}, None),
        ("chat", "ml", {"activationFloor": "3"}, None),
        ("chat", "ml", {"activationFloorFromEnv": "2"}, None),
        ("chat", "", {}, "scaledObjectRef.namespace '' is not a namespace name"),
        ("", "ml", {}, "scaledObjectRef.name '' is not a ScaledObject name"),
        ("Chat", "ml", {}, "scaledObjectRef.name 'Chat' is not a ScaledObject name"),
        ("chat", "ml/x", {}, "scaledObjectRef.namespace 'ml/x' is not a namespace name"),
        ("chat", "ml", {"activationFlor": "3"}, "trigger metadata 'activationFlor' is not known"),
        ("chat", "ml", {"activationFloor": "three"}, "activationFloor='three' is not a whole"),
        ("chat", "ml", {"activationFloor": "0"}, "activationFloor='0' must be at least 1"),
        ("chat", "ml", {"activationFloor": "1.5"}, "activationFloor='1.5' is not a whole"),
        ("chat", "ml", {"activationFloor": "1_0"}, "activationFloor='1_0' is not a whole"),
        ("chat", "ml", {"activationFloor": "+3"}, "activationFloor='.3' is not a whole"),
        ("chat", "ml", {"activationFloor": "٣"}, "activationFloor='٣' is not a whole"),
        ("chat\n", "ml", {}, "scaledObjectRef.name 'chat.n' is not a ScaledObject name"),
        ("chat", "ml\n", {}, "scaledObjectRef.namespace 'ml.n' is not a namespace name"),
    ],
)
def test_a_request_is_read_or_refused_naming_what_is_wrong(
    name: str, namespace: str, metadata: dict[str, str], problem: str | None
) -> None:
    if problem is None:
        request = check_request(name, namespace, metadata)
        assert request.key == f"{namespace}/ScaledObject/{name}"
    else:
        with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)")):
            check_request(name, namespace, metadata)


@pytest.mark.parametrize("field", ["name", "namespace", "metadata key", "metric"])
def test_bad_input_is_echoed_bounded_with_its_length(field: str) -> None:
    huge = "x" * 3_000_000
    with pytest.raises(ValueError) as e:
        if field == "metric":
            check_metric_name(huge, KEY)
        else:
            refs: dict[str, tuple[str, str, dict[str, str]]] = {
                "name": (huge, "ml", {}),
                "namespace": ("chat", huge, {}),
            }
            check_request(*refs.get(field, ("chat", "ml", {huge: "1"})))
    assert len(str(e.value)) < 400 and "3,000,000 characters" in str(e.value)


@pytest.mark.parametrize(("metadata", "activation"), [({}, 1), ({"activationFloor": " 4 "}, 4)])
def test_the_activation_floor_comes_from_the_metadata(
    metadata: dict[str, str], activation: int
) -> None:
    assert check_request("chat", "ml", metadata).activation == activation


@given(
    st.text(max_size=30),
    st.text(max_size=30),
    st.dictionaries(st.text(max_size=20), st.text(max_size=20), max_size=4),
)
def test_any_request_is_read_or_refused_with_a_value_error(
    name: str, namespace: str, metadata: dict[str, str]
) -> None:
    try:
        request = check_request(name, namespace, metadata)
    except ValueError as e:
        assert str(e)  # refused, saying why
    else:
        assert request.activation >= 1 and request.key.endswith("/" + name)


def test_get_metrics_must_ask_for_the_metric_the_spec_named() -> None:
    check_metric_name(METRIC_NAME, KEY)
    with pytest.raises(ValueError, match="'s0-gpuscaler-replica-floor' is not gpuscaler's"):
        check_metric_name("s0-" + METRIC_NAME, KEY)


# --------------------------------------------------------------------------- answers


@pytest.mark.parametrize(
    ("entry", "now", "activation", "value", "active", "reason"),
    [
        (None, 100.0, 1, 0, False, "no tick has planned"),
        (FloorEntry(5, True, "forecast", 100.0), 100.0, 1, 5, True, "floor 5"),
        (FloorEntry(5, True, "forecast", 100.0), 160.0, 1, 5, True, "floor 5"),  # at the limit
        (FloorEntry(5, True, "forecast", 100.0), 161.0, 1, 0, False, "61s old"),
        (FloorEntry(5, False, "no action: stale", 100.0), 101.0, 1, 0, False, "stale"),
        (FloorEntry(0, True, "forecast", 100.0), 101.0, 1, 0, False, "floor 0"),
        (FloorEntry(2, True, "forecast", 100.0), 101.0, 3, 2, False, "floor 2"),
        (FloorEntry(3, True, "forecast", 100.0), 101.0, 3, 3, True, "floor 3"),
    ],
)
def test_only_a_fresh_floor_is_served_else_the_reactive_triggers_decide(
    entry: FloorEntry | None, now: float, activation: int, value: int, active: bool, reason: str
) -> None:
    got = answer(entry, now, max_age=60.0, activation=activation)
    assert (got.value, got.active) == (value, active)
    assert reason in got.reason


# --------------------------------------------------------------------------- from a plan


def _obs(floor: int | None) -> WorkloadObservation:
    return WorkloadObservation(KEY, Signal(last_sample_time=49.0, forecast=None), floor, replicas=2)


def _plan(
    decisions: tuple[Decision, ...] = (), skips: tuple[Skip, ...] = (), fallback: bool = False
) -> Plan:
    history = History().updated({f"replica_floor:{KEY}": TargetHistory(fallback=fallback)})
    return Plan(time=50.0, decisions=decisions, skips=skips, history=history)


def _decision(to: int) -> ReplicaFloorDecision:
    return ReplicaFloorDecision(50.0, KEY, 2, to, "forecast upper 300% -> 5 replicas")


def _skip(reason: str, invalid: bool) -> tuple[Skip]:
    return (Skip(50.0, "replica_floor", KEY, reason, invalid),)


NO_SKILL = "skill fallback: the forecast has had no skill lately"
UNPLANNED = "not planned this tick"


@pytest.mark.parametrize(
    ("plan", "floor", "serving", "want"),
    [
        (_plan((_decision(5),)), 2, None, (5, True, "forecast upper 300% -> 5 replicas")),
        (_plan(skips=_skip("hold: floor stays 4", False)), 4, None, (4, True, "hold: floor stays 4")),
        (_plan(skips=_skip("no action: stale", True)), 4, None, (4, False, "no action: stale")),
        (_plan((_decision(1),), fallback=True), 4, None, (1, False, NO_SKILL)),
        (_plan((_decision(5),)), 2, "dry run", (5, False, "dry run")),
        (_plan(), 4, None, (4, False, UNPLANNED)),
        (_plan(), None, None, (0, False, UNPLANNED)),
    ],
)  # fmt: skip
def test_the_floor_entry_follows_the_plan(
    plan: Plan, floor: int | None, serving: str | None, want: tuple[int, bool, str]
) -> None:
    snapshot = Snapshot(time=50.0, workloads=(_obs(floor),))
    assert floor_entries(plan, snapshot, [KEY], serving) == {KEY: FloorEntry(*want, 50.0)}


@pytest.mark.parametrize(
    ("addresses", "yes"),
    [
        (("gpuscaler.gpuscaler.svc:9095",), True),
        (("gpuscaler.gpuscaler.svc.cluster.local:9095",), True),
        (("gpuscaler:9095",), True),
        (("GPUSCALER.gpuscaler:9095",), True),
        (("other-scaler.gpuscaler:9095",), False),
        (("gpuscaler-other.ns:1",), False),
        (("",), False),
        ((), False),
        (("other:1", "gpuscaler.x:2"), True),
    ],
)
def test_a_trigger_is_gpuscalers_when_its_address_names_the_service(
    addresses: tuple[str, ...], yes: bool
) -> None:
    assert gpuscaler_trigger(addresses, NAMES) is yes


# --------------------------------------------------------------------------- patching


def _so(annotations: dict[str, str] | None = None, **kw: object) -> FloorTarget:
    return FloorTarget(kind="ScaledObject", annotations=annotations or {}, **kw)  # type: ignore[arg-type]


KEDA, ARGO, OWNED = (
    "autoscaling.keda.sh/paused",
    "argocd.argoproj.io/tracking-id",
    "gpuscaler.io/gitops-owned",
)
HPA = "HorizontalPodAutoscaler"


@pytest.mark.parametrize(
    ("target", "direction", "refusal"),
    [
        (_so(), 1, None),
        (_so({KEDA: "true"}), 1, "paused by KEDA"),
        (_so({KEDA: "yes"}), 1, "paused by KEDA"),  # unparsable: true
        (_so({KEDA: "false"}), 1, None),
        (_so({KEDA: "0"}), 1, None),
        (_so({KEDA + "-replicas": "0"}), 1, "paused-replicas='0'"),
        (_so({KEDA + "-replicas": "x"}), -1, "paused-replicas"),
        (_so({KEDA + "-scale-out": "true"}), 1, "scale out paused"),
        (_so({KEDA + "-scale-out": "true"}), -1, None),
        (_so({KEDA + "-scale-in": "true"}), -1, "scale in paused"),
        (_so({KEDA + "-scale-in": "true"}), 1, None),
        (_so(external_addresses=("gpuscaler.gpuscaler.svc:9095",)), 1, "served through KEDA"),
        (_so(external_addresses=("other.ns:9095",)), 1, None),
        (_so(floor_managers=("argocd-controller",)), 1, "GitOps field manager 'argocd-controller'"),
        (_so(floor_managers=("kubectl-client-side-apply", "gpuscaler")), 1, None),
        (_so({ARGO: "app:keda.sh/ScaledObject:ml/chat"}), 1, "managed by a GitOps tool"),
        (_so({ARGO: "a", OWNED: "false"}), 1, None),
        (_so({OWNED: "false"}, floor_managers=("kustomize-controller",)), 1, "kustomize-controller"),
        (_so({OWNED: "true"}), 1, "declared GitOps-owned"),
        (_so(labels={"kustomize.toolkit.fluxcd.io/name": "a"}), 1, "kustomize.toolkit.fluxcd.io/name"),
        (FloorTarget(HPA, annotations={KEDA: "true"}), 1, None),
        (FloorTarget(HPA, floor_managers=("helm-controller",)), 1, "helm-controller"),
    ],
)  # fmt: skip
def test_a_floor_is_patched_only_where_nobody_else_owns_it(
    target: FloorTarget, direction: int, refusal: str | None
) -> None:
    got = floor_patch_refusal(target, direction, GITOPS, NAMES)
    if refusal is None:
        assert got is None
    else:
        assert got is not None and refusal in got


# --------------------------------------------------------------------------- reading


def test_the_floor_owner_and_triggers_are_read_from_the_objects_json() -> None:
    from gpuscaler.adapters.kube.objects import external_addresses, floor_managers

    meta = {
        "managedFields": [  # as the API server records them (ManagedFieldsEntry)
            {"manager": "kubectl-client-side-apply", "fieldsV1": {"f:metadata": {}}},
            {
                "manager": "argocd-controller",
                "operation": "Apply",
                "fieldsV1": {"f:spec": {"f:minReplicaCount": {}}},
            },
            {
                "manager": "gpuscaler",
                "operation": "Update",
                "fieldsV1": {"f:spec": {"f:minReplicas": {}}},
            },
        ]
    }
    assert floor_managers(meta, "ScaledObject") == ("argocd-controller",)
    assert floor_managers(meta, "HorizontalPodAutoscaler") == ("gpuscaler",)
    spec = {
        "triggers": [
            {"type": "prometheus", "metadata": {"serverAddress": "http://p:9090"}},
            {"type": "external", "metadata": {"scalerAddress": "gpuscaler.gpuscaler.svc:9095"}},
            {"type": "external-push", "metadata": {"scalerAddress": "other:1"}},
        ]
    }
    assert external_addresses(spec) == ("gpuscaler.gpuscaler.svc:9095", "other:1")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


_SPEC_FIELDS = st.dictionaries(
    st.sampled_from(["f:minReplicaCount", "f:minReplicas", "f:x"]), _JSON, max_size=2
)
_MANAGED = _JSON | st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "manager": _JSON,
            "fieldsV1": _JSON | st.dictionaries(st.just("f:spec"), _JSON | _SPEC_FIELDS),
        },
    )
    | _JSON,
    max_size=3,
)
_TRIGGERS = _JSON | st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["external", "external-push", "cpu"]) | _JSON,
            "metadata": _JSON | st.dictionaries(st.just("scalerAddress"), _JSON),
        },
    ),
    max_size=3,
)


@given(_MANAGED, _TRIGGERS)
def test_any_json_shape_reads_as_some_or_no_owner_never_a_crash(
    managed: object, triggers: object
) -> None:
    from gpuscaler.adapters.kube.objects import external_addresses, floor_managers

    assert isinstance(floor_managers({"managedFields": managed}, "ScaledObject"), tuple)
    assert isinstance(external_addresses({"triggers": triggers}), tuple)
