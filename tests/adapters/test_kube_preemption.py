"""Three-tier preemption against the fake API server, for what a real one cannot do on
demand (a 500 between two steps, hand-edited pod states); the real Eviction API, PDBs and
scheduler: tests/e2e/test_preemption_real.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubefake import FakeCluster, serving
from kubeobjects import gpu_pod, node
from kubernetes import client
from steps import steps

from gpuscaler.adapters.kube.actuator import KubeActuator, kube_actuator
from gpuscaler.adapters.kube.objects import rfc3339
from gpuscaler.adapters.kube.preemption_reader import PreemptionReader
from gpuscaler.adapters.kube.preemption_records import STATE_CONFIGMAP
from gpuscaler.adapters.kube.reader import ClusterReader
from gpuscaler.config import Config, parse_config
from gpuscaler.core.decisions import Decision, Skip
from gpuscaler.core.preemption import decide_preemption

T0 = 1_800_000_000.0
CONFIG_TEXT = """
node_pools:
  - {name: a100, gpu_memory_gib: 80, selector: {label: nvidia.com/gpu.product, value: NVIDIA-A100-SXM4-80GB}}
preemption:
  soft_grace: 5m
  memory_release_timeout: 2m
  eviction_retry: 30s
  max_eviction_attempts: 2
"""
CONFIG = parse_config(CONFIG_TEXT)
Api = tuple[client.ApiClient, FakeCluster]


def _pending(name: str = "critical", gpus: int = 2, since: float = T0 - 60) -> dict[str, Any]:
    pod = gpu_pod(name, None, gpus, namespace="serving", priority=1_000_000, phase="Pending")
    pod["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "lastTransitionTime": rfc3339(since),
        }
    ]
    return pod


def _seed(fake: FakeCluster, **victim_kw: Any) -> None:
    """One node, 2 GPUs x 2 shares, full: two batch pods of 2 shares (priorities 100 and
    10), and a critical pod pending for two shares."""
    fake.add("v1", "nodes", node("gpu-0", config="ts-2", gpus=2))
    fake.add("v1", "pods", gpu_pod("keep", "gpu-0", 2, namespace="batch", priority=100))
    victim = gpu_pod("train", "gpu-0", 2, namespace="batch", priority=10)
    victim["metadata"]["labels"] = {"app": "train"}
    victim["metadata"].update(victim_kw)
    fake.add("v1", "pods", victim)
    fake.add("v1", "pods", _pending())


@pytest.fixture
def started(api: Api) -> tuple[Tick, FakeCluster]:
    """The seeded cluster after the first tick: batch/train asked to checkpoint at T0."""
    _seed(api[1])
    tick = Tick(api)
    tick(T0)
    return tick, api[1]


class Tick:
    """One control tick's preemption part, with fresh adapter objects each time (as
    after a restart): read, decide, act."""

    def __init__(self, api: Api, may_act: bool = True, config: Config = CONFIG, memory: Any = None):
        self.api, self.may_act, self.config, self.memory = api, may_act, config, memory

    def __call__(
        self, now: float
    ) -> tuple[tuple[Decision, ...], tuple[Skip, ...], tuple[Decision, ...]]:
        api, config = self.api[0], self.config
        cluster = ClusterReader(api, config)
        cluster.state()
        obs = PreemptionReader(api, config, cluster, "gpuscaler", self.memory).observe(now)
        decisions, skips = decide_preemption(obs, config.preemption, now)
        actuator: KubeActuator = kube_actuator(api, config, "test", may_act=lambda: self.may_act)
        return decisions, skips, actuator.apply(decisions)


def _state(fake: FakeCluster, victim: str = "batch.train") -> dict[str, Any]:
    cm = fake.get("v1", "configmaps", "gpuscaler", STATE_CONFIGMAP)
    assert cm is not None
    record: dict[str, Any] = json.loads(cm["data"][victim])
    return record


def _evictions(fake: FakeCluster) -> list[tuple[str, str]]:
    return [r for r in fake.requests if r[1].endswith("/eviction")]


def _events(fake: FakeCluster) -> list[str]:
    return [o["reason"] for (_, p, _, _), o in sorted(fake.objects.items()) if p == "events"]


def test_the_three_tiers_run_in_order_with_evidence_before_the_eviction(api: Api) -> None:
    _, fake = api
    _seed(fake)
    tick = Tick(api)
    _, _, applied = tick(T0)
    assert [(d.target, d.to_value) for d in applied] == [("batch/train", "soft")]
    victim = fake.get("v1", "pods", "batch", "train")
    assert victim is not None
    assert victim["metadata"]["annotations"]["gpuscaler.io/checkpoint-requested"] == rfc3339(T0)
    beneficiary = fake.get("v1", "pods", "serving", "critical")
    assert beneficiary is not None
    assert "batch/train" in beneficiary["metadata"]["annotations"]["gpuscaler.io/preempting"]
    assert _state(fake)["tier"] == "soft"

    _, skips, applied = tick(T0 + 60)
    assert applied == () and any("soft tier, 240s left" in s.reason for s in skips)

    victim["metadata"]["annotations"]["gpuscaler.io/checkpoint-done"] = rfc3339(T0 + 70)
    fake.objects[("v1", "pods", "batch", "train")] = victim  # the workload acknowledges
    _, _, applied = tick(T0 + 80)
    assert [(d.to_value, d.action) for d in steps(applied)] == [("hard", "evict")]
    assert fake.get("v1", "pods", "batch", "train") is None
    record = _state(fake)
    assert record["tier"] == "hard" and record["evicted_at"] == T0 + 80
    assert record["beneficiary"] == "serving/critical" and record["node"] == "gpu-0"
    order = [r for r in fake.requests if "/pods/train" in r[1] or "gpuscaler-preemptions" in r[1]]
    eviction = order.index(("POST", "/api/v1/namespaces/batch/pods/train/eviction"))
    evidence = max(i for i, r in enumerate(order[:eviction]) if "gpuscaler-preemptions" in r[1])
    assert evidence < eviction  # the record, then the eviction

    _, _, applied = tick(T0 + 90)
    assert [d.to_value for d in applied] == ["cleanup"]
    _, _, applied = tick(T0 + 90 + 121)  # no dcgm series here: memory not measurable
    assert [d.to_value for d in applied] == ["done"]
    assert "not verified" in _state(fake)["reason"]
    assert _events(fake).count("PreemptionRequested") == 1
    assert _events(fake).count("Preempting") == 1
    assert len(_evictions(fake)) == 1
    keep = fake.get("v1", "pods", "batch", "keep")
    assert keep is not None and "annotations" not in keep["metadata"]  # priority 100 spared


@pytest.mark.parametrize(
    ("crash", "evictions_sent"),
    [
        (None, 1),
        (("POST", r"/eviction$", 0), 2),
        (("PATCH", "/configmaps/gpuscaler-preemptions$", 1), 1),
        (("PATCH", "/configmaps/gpuscaler-preemptions$", 0), 1),
    ],
    ids=[
        "restarted every tick",
        "died after recording the hard tier, before the eviction was sent",
        "died after the eviction, before recording it",
        "died writing the evidence: nothing was done to the pod",
    ],
)
def test_a_restart_at_any_tier_resumes_never_repeats_never_forgets(
    api: Api, crash: tuple[str, str, int] | None, evictions_sent: int
) -> None:
    _, fake = api
    _seed(fake)
    Tick(api)(T0)
    if crash is not None:
        verb, path, after = crash
        fake.fail_next(verb, path, 500, after=after)
    tiers = []
    for t in (T0 + 301, T0 + 320, T0 + 350, T0 + 360, T0 + 500, T0 + 700):
        Tick(api)(t)  # a fresh controller every tick, as after a restart
        tiers.append(_state(fake)["tier"])
    assert tiers[-1] == "done", tiers
    assert len(_evictions(fake)) == evictions_sent
    assert fake.answered("POST", r"/eviction$", 201) == 1  # evicted exactly once
    assert _events(fake).count("PreemptionRequested") == 1
    assert _events(fake).count("Preempting") == 1
    assert fake.get("v1", "pods", "batch", "train") is None


def test_a_pdb_refusal_is_retried_then_given_up_and_never_forced(api: Api) -> None:
    _, fake = api
    _seed(fake)
    fake.add(
        "policy/v1",
        "poddisruptionbudgets",
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "train", "namespace": "batch"},
            "spec": {"selector": {"matchLabels": {}}, "minAvailable": 2},  # every batch pod
            "status": {"disruptionsAllowed": 0},
        },
    )
    tick = Tick(api)
    tick(T0)
    tick(T0 + 301)  # soft grace over: 429
    record = _state(fake)
    assert record["tier"] == "hard" and record["attempts"] == 1 and record["evicted_at"] is None
    _, skips, _ = tick(T0 + 310)
    assert any("retry in" in s.reason for s in skips)
    tick(T0 + 335)  # second refusal
    _, _, applied = tick(T0 + 370)
    assert [d.to_value for d in applied] == ["given_up"]
    assert fake.get("v1", "pods", "batch", "train") is not None  # PDB respected
    assert not [r for r in fake.requests if r[0] == "DELETE"]


def test_a_pod_stuck_terminating_is_force_deleted(started: tuple[Tick, FakeCluster]) -> None:
    tick, fake = started
    victim = fake.get("v1", "pods", "batch", "train")
    tick(T0 + 301)  # evicted; the kubelet never finishes: the pod stays Terminating
    assert victim is not None
    victim["metadata"]["deletionTimestamp"] = rfc3339(T0 + 301)
    fake.add("v1", "pods", victim)
    _, skips, _ = tick(T0 + 400)
    assert any("terminating for 99s" in s.reason for s in skips)
    _, _, applied = tick(T0 + 602)
    assert [d.action for d in steps(applied)] == ["force_delete"]
    deletes = [r for r in fake.requests if r[0] == "DELETE"]
    assert deletes == [("DELETE", "/api/v1/namespaces/batch/pods/train")]
    assert fake.get("v1", "pods", "batch", "train") is None
    assert len(_evictions(fake)) == 1  # never evicted twice


def test_a_victim_that_exits_during_the_soft_tier_skips_the_eviction(
    started: tuple[Tick, FakeCluster],
) -> None:
    tick, fake = started
    del fake.objects[("v1", "pods", "batch", "train")]  # it checkpointed and exited
    _, _, applied = tick(T0 + 30)
    assert [d.to_value for d in applied] == ["cleanup"]
    assert _evictions(fake) == []


def test_a_beneficiary_scheduled_elsewhere_aborts_the_soft_tier(
    started: tuple[Tick, FakeCluster],
) -> None:
    tick, fake = started
    pending = fake.get("v1", "pods", "serving", "critical")
    assert pending is not None
    pending["spec"]["nodeName"] = "gpu-9"
    fake.objects[("v1", "pods", "serving", "critical")] = pending
    _, _, applied = tick(T0 + 30)
    assert [d.to_value for d in applied] == ["aborted"]
    victim = fake.get("v1", "pods", "batch", "train")
    assert victim is not None
    assert "gpuscaler.io/checkpoint-requested" not in victim["metadata"]["annotations"]


def test_a_non_leader_plans_but_never_writes(api: Api) -> None:
    _, fake = api
    _seed(fake)
    decisions, _, applied = Tick(api, may_act=False)(T0)
    assert [d.to_value for d in decisions] == ["soft"] and applied == ()
    assert not [r for r in fake.requests if r[0] in ("POST", "PATCH", "PUT", "DELETE")]


def test_a_protected_namespace_is_never_touched(api: Api) -> None:
    _, fake = api
    fake.add("v1", "nodes", node("gpu-0", config="ts-2", gpus=2))
    fake.add("v1", "pods", gpu_pod("dcgm", "gpu-0", 4, namespace="gpu-operator", priority=0))
    fake.add("v1", "pods", _pending())
    decisions, skips, _ = Tick(api)(T0)
    assert decisions == ()
    assert any("would not fit" in s.reason for s in skips)
    assert not [r for r in fake.requests if r[0] in ("POST", "PATCH", "DELETE")]


class HeldMemory:
    """A memory probe whose GPUs stay held (the real one is tested against Prometheus)."""

    def released(self, state: object, now: float) -> bool:
        return False


def test_memory_still_held_after_the_victim_left_taints_and_labels_the_node(api: Api) -> None:
    _, fake = api
    _seed(fake)
    tick = Tick(api, memory=HeldMemory())
    for t in (T0, T0 + 301, T0 + 310, T0 + 500):
        tick(t)
    assert _state(fake)["tier"] == "quarantined"
    node = fake.get("v1", "nodes", None, "gpu-0")
    assert node is not None
    assert node["spec"]["taints"] == [
        {"key": "gpuscaler.io/gpu-memory-held", "value": "true", "effect": "NoSchedule"}
    ]
    assert node["metadata"]["labels"]["gpuscaler.io/gpu-cleanup"] == "required"
    warnings = [
        o for (_, p, _, _), o in fake.objects.items() if p == "events" and o["type"] == "Warning"
    ]
    assert "GPUMemoryHeld" in [e["reason"] for e in warnings]


def test_the_checkpoint_endpoint_is_called_with_the_reason_and_deadline(api: Api) -> None:
    from http.server import BaseHTTPRequestHandler

    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(202)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    _, fake = api
    _seed(fake)
    victim = fake.objects[("v1", "pods", "batch", "train")]
    victim["status"]["podIP"] = "127.0.0.1"
    with serving(Handler) as url:
        port = url.rsplit(":", 1)[1]
        endpoint = f'  checkpoint_endpoint: "http://{{pod_ip}}:{port}/checkpoint"\n'
        Tick(api, config=parse_config(CONFIG_TEXT + endpoint))(T0)
    assert len(received) == 1
    assert received[0]["deadline"] == rfc3339(T0 + 300)
    assert "serving/critical" in received[0]["reason"]
