"""The shipped RBAC grants exactly what the code uses: every API call of a scenario that
walks every code path is allowed by the rendered ClusterRole/Roles and their bindings,
and every grant is used by some call. (The same calls as the ServiceAccount against the real
RBAC authorizer: tests/e2e/test_rbac_real.py.)"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest
from builders import NOW
from draobjects import API, claim_template, device_class, gpu_slice
from kubefake import _PATH, FakeCluster
from kubeobjects import gpu_pod, hpa, node, plugin_configmap, scaled_object, unschedulable
from kubernetes import client
from test_deploy import render

from gpuscaler.adapters.kube.actuator import KubeActuator, kube_actuator
from gpuscaler.adapters.kube.cache import ClusterCache
from gpuscaler.adapters.kube.preemption_reader import PreemptionReader
from gpuscaler.adapters.kube.reader import ClusterReader
from gpuscaler.config import Config, ConfigError, parse_config
from gpuscaler.controller.assembly import cluster_controller
from gpuscaler.core.decisions import (
    CheckpointRequest,
    Eviction,
    FragmentsDecision,
    PreemptionStep,
    ReplicaFloorDecision,
    TimeSliceDecision,
)
from gpuscaler.core.preemption import PreemptionObservation, decide_preemption
from gpuscaler.leader import LeaderElector

NAMESPACE = "gpuscaler"  # where the Deployment runs (POD_NAMESPACE)
CONFIG = parse_config(
    """
prometheus: {url: "http://127.0.0.1:1", timeout: 1s, retries: 0}
preemption: {checkpoint_endpoint: "http://{pod_ip}:9/checkpoint"}
kubernetes: {config_propagation: 0s, watch_cache: false}  # the walk covers every call; the wait is tested elsewhere
node_pools:
  - {name: a100, gpu_memory_gib: 80, selector: {label: nvidia.com/gpu.product, value: NVIDIA-A100-SXM4-80GB}}
  - {name: dra, gpu_memory_gib: 40, selector: {label: gpuscaler.test/pool, value: dra}}
workloads:
  - {namespace: ml, kind: ScaledObject, name: chat}
  - {namespace: ml, kind: HorizontalPodAutoscaler, name: embed}
"""
)


@dataclass(frozen=True)
class Call:
    verb: str
    group: str
    resource: str
    namespace: str | None
    name: str | None


def as_call(method: str, path: str) -> Call:
    m = _PATH.match(path)
    assert m is not None, path
    group = "" if m.group("core") else m.group("group")
    resource, name, sub = m.group("plural"), m.group("name"), m.group("sub")
    if sub:
        resource = f"{resource}/{sub}"
    verb = {
        "GET": "get" if name else "list",
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete",
    }[method]
    return Call(verb, group, resource, m.group("ns"), None if method == "POST" else name)


def _scenario(api: client.ApiClient, fake: FakeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Kubernetes call gpuscaler can make, conflicts and re-reads included."""
    monkeypatch.setenv("POD_NAME", "gpuscaler-abc")
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)
    fake.add("v1", "configmaps", plugin_configmap({}))
    for i in range(2):
        fake.add("v1", "nodes", node(f"gpu-{i}"))
    fake.add("v1", "pods", gpu_pod("chat-1", "gpu-0"))
    fake.add("keda.sh/v1alpha1", "scaledobjects", scaled_object("chat", 2))
    fake.add("autoscaling/v2", "horizontalpodautoscalers", hpa("embed", 1))
    ClusterReader(api, CONFIG).state()
    actuator = kube_actuator(api, CONFIG, "gpuscaler-abc")
    fake.fail_next("PATCH", "/nodes/gpu-0$", 409)  # re-read the node
    fake.fail_next("PATCH", "/configmaps/", 409)  # re-read the ConfigMap
    actuator.apply(
        [
            FragmentsDecision(NOW, "a100", 2, 4, "r"),
            TimeSliceDecision(NOW, "a100", "medium", "long", "r"),
            ReplicaFloorDecision(NOW, "ml/ScaledObject/chat", 2, 5, "r"),
            ReplicaFloorDecision(NOW, "ml/HorizontalPodAutoscaler/embed", 1, 3, "r"),
        ]
    )
    elector = LeaderElector(api, NAMESPACE, "gpuscaler-abc", CONFIG.kubernetes.lease)
    elector.step()  # create
    elector.step()  # get, update
    elector.release()
    parts = cluster_controller(CONFIG, api, dry_run=True, config_path="/nonexistent/config.yaml")
    try:
        assert parts.reloader is not None
        parts.reloader.on_refused(ConfigError("c.yaml", ["x: bad"]))  # the refusal Event
    finally:
        parts.stop()  # its watch cache's threads end with the test
    _preemption(api, fake)
    _dra_sharing(api, fake)


def _dra_sharing(api: client.ApiClient, fake: FakeCluster) -> None:
    """A pool shared under DRA: its opted-in class patched and template replaced, each after
    a conflict (re-read)."""
    fake.add("v1", "nodes", node("dra-0", extra_labels={"gpuscaler.test/pool": "dra"}))
    fake.add(API, "resourceslices", gpu_slice("dra-0", 1, sharing=True))
    for doc in (device_class("shared"), claim_template("ml", "quarter", memory="10Gi")):
        doc["metadata"]["labels"] = {"gpuscaler.io/pool": "dra"}
        fake.add(
            API, "deviceclasses" if doc["kind"] == "DeviceClass" else "resourceclaimtemplates", doc
        )
    fake.fail_next("PATCH", "/deviceclasses/shared$", 409)
    fake.fail_next("DELETE", "/resourceclaimtemplates/quarter$", 409)
    decisions = (
        FragmentsDecision(NOW, "dra", 4, 2, "r"),
        TimeSliceDecision(NOW, "dra", "default", "long", "r"),
    )
    assert kube_actuator(api, CONFIG, "gpuscaler-abc").apply(decisions) == decisions


def _preemption(api: client.ApiClient, fake: FakeCluster) -> None:
    """Every preemption step: checkpoint request (and its HTTP call), eviction, force
    delete, quarantine, against a victim on gpu-1."""
    victim = gpu_pod("train", "gpu-1", 16, namespace="batch", priority=10)  # all of gpu-1
    victim["status"]["podIP"] = "127.0.0.1"
    fake.add("v1", "pods", victim)
    pending = gpu_pod(
        "critical", None, 16, namespace="serving", priority=1_000_000, phase="Pending"
    )
    pending["status"]["conditions"] = [unschedulable("2020-01-01T00:00:00Z")]
    fake.add("v1", "pods", pending)
    config = CONFIG
    cluster = ClusterReader(api, config)
    cluster.state()
    actuator = kube_actuator(api, config, "gpuscaler-abc", namespace=NAMESPACE)
    reader = PreemptionReader(api, config, cluster, NAMESPACE)
    walk_the_tiers(actuator, reader.observe(NOW), config, NOW)


def walk_the_tiers(
    actuator: KubeActuator, obs: PreemptionObservation, config: Config, now: float
) -> None:
    """One victim chosen and every tier after it applied: checkpoint request, eviction,
    force delete, record gone, quarantine."""
    soft, _ = decide_preemption(obs, config.preemption, now)
    assert [d.to_value for d in soft] == ["soft"]
    assert actuator.apply(soft) == soft
    (first,) = soft
    assert isinstance(first, CheckpointRequest)
    at = (first.target, "r")
    where = (first.beneficiary, first.node)
    for step in (
        Eviction(now + 1, at[0], "soft", "hard", at[1], "evict", *where, grace_seconds=0.0),
        PreemptionStep(now + 2, at[0], "hard", "hard", at[1], "force_delete", *where),
        PreemptionStep(now + 3, at[0], "hard", "cleanup", at[1], "record_gone", *where),
        PreemptionStep(now + 4, at[0], "cleanup", "quarantined", at[1], "quarantine", *where),
    ):
        assert actuator.apply([step]) == (step,), step.action


def _cache_calls() -> set[Call]:
    """The watch cache's list and watch of each resource it caches (the fake server has no
    watch; the real authorizer sees them in tests/e2e/test_rbac_real.py). A `metadata.name`
    field selector is authorized as that name, as RBAC does for list and watch."""
    cache = ClusterCache(client.ApiClient(), NAMESPACE, CONFIG.kubernetes)
    calls = set()
    for informer in cache.informers.values():
        r = informer.resource
        m = _PATH.match(r.path)
        assert m is not None, r.path
        group = "" if m.group("core") else m.group("group")
        name = (r.field_selector or "").removeprefix("metadata.name=") or None
        calls |= {Call(v, group, m.group("plural"), m.group("ns"), name) for v in ("list", "watch")}
    return calls


def _rules() -> list[tuple[dict[str, Any], str | None]]:
    """(rule, namespace it applies in; None = every namespace) for gpuscaler's account."""
    docs = render("deploy")
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs}
    out = []
    for b in docs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["name"] == "gpuscaler" and s["namespace"] == NAMESPACE for s in b["subjects"]):
            continue
        ref = b["roleRef"]
        ns = b["metadata"].get("namespace")
        role = roles[(ref["kind"], None if ref["kind"] == "ClusterRole" else ns, ref["name"])]
        out += [(rule, ns) for rule in role["rules"]]
    return out


def _allows(rule: dict[str, Any], ns: str | None, call: Call) -> bool:
    names = rule.get("resourceNames")
    return (
        call.group in rule["apiGroups"]
        and call.resource in rule["resources"]
        and call.verb in rule["verbs"]
        and (ns is None or call.namespace == ns)
        and (not names or call.name in names)
    )


def test_every_call_is_allowed_and_every_grant_is_used(
    api: tuple[client.ApiClient, FakeCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    _scenario(*api, monkeypatch)
    fake = api[1]  # its request log
    calls = {as_call(m, p) for m, p in fake.requests} | _cache_calls()
    rules = _rules()
    denied = [c for c in calls if not any(_allows(r, ns, c) for r, ns in rules)]
    assert denied == []
    unused = [
        (r["apiGroups"], r["resources"], verb, ns)
        for r, ns in rules
        for verb in r["verbs"]
        if not any(_allows({**r, "verbs": [verb]}, ns, c) for c in calls)
    ]
    assert unused == []
    # The scenario did exercise the conflict paths (re-reads) and all three actuators.
    assert Call("get", "", "nodes", None, "gpu-0") in calls
    patched = {c.resource for c in calls if c.verb == "patch"}
    assert patched == {
        "nodes",
        "configmaps",
        "scaledobjects",
        "horizontalpodautoscalers",
        "pods",
        "deviceclasses",
    }


@pytest.mark.parametrize(
    ("call", "allowed"),
    [
        (Call("delete", "", "nodes", None, "gpu-0"), False),
        (Call("patch", "", "configmaps", "kube-system", "gpuscaler-sharing-configs"), False),
        (Call("patch", "", "configmaps", "nvidia-device-plugin", "other"), False),
        (Call("update", "coordination.k8s.io", "leases", NAMESPACE, "someone-else"), False),
        (Call("list", "", "secrets", None, None), False),
        (Call("patch", "keda.sh", "scaledobjects", "ml", "chat"), True),
    ],
    ids=lambda v: re.sub(r"\W+", "-", str(v))[:60] if isinstance(v, Call) else str(v),
)
def test_the_rules_refuse_what_gpuscaler_never_does(call: Call, allowed: bool) -> None:
    assert any(_allows(r, ns, call) for r, ns in _rules()) is allowed
