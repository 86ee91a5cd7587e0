"""Three-tier preemption against the real kube-apiserver: the real Eviction API
(policy/v1), a PodDisruptionBudget whose status the real controller-manager fills (pods
made Running/Ready by a status patch, as a kubelet would), the Priority admission plugin,
and no kubelet to finish a graceful deletion, so an evicted pod really stays Terminating.

Faults a real server cannot be made to give (a 500 between two steps, to test restarts)
stay on the fake server in test_kube_preemption.py."""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

import pytest
from controlplane import Kube, Recorder, wait_until
from kubeobjects import classed_pod, deployment, node, priority_class
from kubernetes.client.exceptions import ApiException
from steps import steps

from gpuscaler.adapters.kube.actuator import kube_actuator
from gpuscaler.adapters.kube.objects import rfc3339
from gpuscaler.adapters.kube.preemption_reader import PreemptionReader
from gpuscaler.adapters.kube.preemption_records import STATE_CONFIGMAP
from gpuscaler.adapters.kube.reader import ClusterReader
from gpuscaler.config import Config, parse_config
from gpuscaler.core.decisions import Decision, Skip
from gpuscaler.core.preemption import decide_preemption

CONFIG = parse_config(
    """
node_pools:
  - {name: a100, gpu_memory_gib: 80, selector: {label: nvidia.com/gpu.product, value: NVIDIA-A100-SXM4-80GB}}
preemption:
  soft_grace: 5m
  memory_release_timeout: 2m
  eviction_retry: 30s
  max_eviction_attempts: 2
"""
)
CLASSES = {"gpu-test-critical": 1_000_000, "gpu-test-batch-keep": 100, "gpu-test-batch": 10}


class Cluster:
    """Two fresh namespaces (the victims', the beneficiary's) and gpuscaler's own."""

    def __init__(self, kube: Kube):
        self.kube = kube
        self.batch, self.serving, self.home = kube.namespace(), kube.namespace(), kube.namespace()
        for name, value in CLASSES.items():
            kube.ensure(priority_class(name, value))
        self.api = kube.plane.api()
        self.record = Recorder(self.api)

    def pod(self, name: str, ns: str, node_name: str | None, gpus: int, cls: str) -> dict[str, Any]:
        doc = classed_pod(name, node_name, gpus, ns, cls)
        doc["metadata"]["labels"] = {"app": name}
        return self.kube.create(doc)

    def seed(self, since: float) -> None:
        """One node, 2 GPUs x 2 shares, full: two batch pods of 2 shares (priorities 100
        and 10), Running and Ready, and a critical pod pending for two shares."""
        self.kube.seed([node("gpu-0", config="ts-2", gpus=2)])
        self.pod("keep", self.batch, "gpu-0", 2, "gpu-test-batch-keep")
        self.pod("train", self.batch, "gpu-0", 2, "gpu-test-batch")
        for name in ("keep", "train"):
            self.kube.make_running(self.batch, name)
        self.pod("critical", self.serving, None, 2, "gpu-test-critical")
        message = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
        self.kube.mark_unschedulable(self.serving, "critical", rfc3339(since), message)

    def tick(
        self, now: float, config: Config = CONFIG
    ) -> tuple[tuple[Decision, ...], tuple[Skip, ...], tuple[Decision, ...]]:
        """Read, decide, act, with fresh adapter objects (as after a restart)."""
        cluster = ClusterReader(self.api, config)
        cluster.state()
        obs = PreemptionReader(self.api, config, cluster, self.home).observe(now)
        decisions, skips = decide_preemption(obs, config.preemption, now)
        actuator = kube_actuator(self.api, config, "test", namespace=self.home)
        return decisions, skips, actuator.apply(decisions)

    def victim(self) -> dict[str, Any] | None:
        try:
            return self.kube.get(f"/api/v1/namespaces/{self.batch}/pods/train")
        except ApiException as e:
            assert e.status == 404
            return None

    def state(self) -> dict[str, Any]:
        cm = self.kube.get(f"/api/v1/namespaces/{self.home}/configmaps/{STATE_CONFIGMAP}")
        record: dict[str, Any] = json.loads(cm["data"][f"{self.batch}.train"])
        return record

    def evictions(self) -> list[int]:
        return [st for m, p, st in self.record.calls if p.endswith("/pods/train/eviction")]

    def pdb(self, min_available: int) -> dict[str, Any]:
        """A PDB over both batch pods; returns its status once the controller filled it."""
        self.kube.create(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": "batch", "namespace": self.batch},
                "spec": {
                    "selector": {"matchExpressions": [{"key": "app", "operator": "Exists"}]},
                    "minAvailable": min_available,
                },
            }
        )
        path = f"/apis/policy/v1/namespaces/{self.batch}/poddisruptionbudgets/batch"
        wait_until(
            "the disruption controller fills the PDB status",
            lambda: self.kube.get(path).get("status", {}).get("currentHealthy") == 2,
            30,
            0.2,
        )
        status: dict[str, Any] = self.kube.get(path)["status"]
        return status


@pytest.fixture
def cluster(kube: Kube) -> Cluster:
    return Cluster(kube)


def test_the_three_tiers_through_the_real_eviction_api(cluster: Cluster) -> None:
    # The decisions run on a virtual clock ahead of which the server's own timestamps
    # (the deletionTimestamp an eviction sets) must not fall: start it in the past.
    t0 = time.time() - 400
    cluster.seed(t0 - 60)
    _, _, applied = cluster.tick(t0)
    assert [(d.target, d.to_value) for d in applied] == [(f"{cluster.batch}/train", "soft")]
    victim = cluster.victim()
    assert victim is not None
    assert victim["metadata"]["annotations"]["gpuscaler.io/checkpoint-requested"] == rfc3339(t0)
    _, skips, applied = cluster.tick(t0 + 60)
    assert applied == () and any("soft tier, 240s left" in s.reason for s in skips)

    _, _, applied = cluster.tick(t0 + 301)  # soft grace over: the Eviction API
    assert [(d.to_value, d.action) for d in steps(applied)] == [("hard", "evict")]
    assert cluster.evictions() == [201]
    # No kubelet finishes the graceful deletion: the real server leaves the pod
    # Terminating, with the DisruptionTarget condition the Eviction API itself sets.
    victim = cluster.victim()
    assert victim is not None and victim["metadata"].get("deletionTimestamp")
    (target,) = [c for c in victim["status"]["conditions"] if c["type"] == "DisruptionTarget"]
    assert target["reason"] == "EvictionByEvictionAPI"
    assert cluster.state()["tier"] == "hard"

    deleting = datetime.fromisoformat(victim["metadata"]["deletionTimestamp"]).timestamp()
    assert abs(deleting - (time.time() + 30)) < 30  # now + the eviction's grace period
    _, skips, applied = cluster.tick(deleting + 99)
    assert applied == () and any("terminating for 99s" in s.reason for s in skips)
    _, _, applied = cluster.tick(deleting + 301)  # past terminating_timeout
    assert [d.action for d in steps(applied)] == ["force_delete"]
    assert cluster.victim() is None
    _, _, applied = cluster.tick(deleting + 310)
    assert [d.to_value for d in applied] == ["cleanup"]
    _, _, applied = cluster.tick(deleting + 310 + 121)  # no dcgm series: not measurable
    assert [d.to_value for d in applied] == ["done"]
    assert cluster.evictions() == [201]  # evicted exactly once
    keep = cluster.kube.get(f"/api/v1/namespaces/{cluster.batch}/pods/keep")
    assert not (keep["metadata"].get("annotations") or {})  # priority 100 spared


def test_a_pdb_the_controller_manager_keeps_refuses_the_eviction_and_it_is_never_forced(
    cluster: Cluster,
) -> None:
    t0 = time.time()
    cluster.seed(t0 - 60)
    status = cluster.pdb(min_available=2)  # both batch pods must stay
    assert status["disruptionsAllowed"] == 0 and status["expectedPods"] == 2
    cluster.tick(t0)
    cluster.tick(t0 + 301)  # soft grace over: the real server answers 429
    assert cluster.evictions() == [429]
    record = cluster.state()
    assert record["tier"] == "hard" and record["attempts"] == 1 and record["evicted_at"] is None
    _, skips, _ = cluster.tick(t0 + 310)
    assert any("retry in" in s.reason for s in skips)
    cluster.tick(t0 + 335)  # second refusal
    _, _, applied = cluster.tick(t0 + 370)
    assert [d.to_value for d in applied] == ["given_up"]
    assert cluster.evictions() == [429, 429]
    victim = cluster.victim()
    assert victim is not None and not victim["metadata"].get("deletionTimestamp")
    assert not [c for c in cluster.record.calls if c[0] == "DELETE"]


def test_a_pdb_with_room_lets_the_eviction_through(cluster: Cluster) -> None:
    t0 = time.time()
    cluster.seed(t0 - 60)
    status = cluster.pdb(min_available=1)
    assert status["disruptionsAllowed"] == 1
    cluster.tick(t0)
    _, _, applied = cluster.tick(t0 + 301)
    assert [d.action for d in steps(applied)] == ["evict"]
    assert cluster.evictions() == [201]
    path = f"/apis/policy/v1/namespaces/{cluster.batch}/poddisruptionbudgets/batch"
    # The eviction spent the budget (the API server decrements it, the controller agrees).
    assert cluster.kube.get(path)["status"]["disruptionsAllowed"] == 0


def test_the_real_schedulers_unschedulable_verdict_is_what_gpuscaler_reads(
    scheduler: object, cluster: Cluster
) -> None:
    """kube-scheduler, not a hand-written status, marks the pod Unschedulable; the pods
    on the node have the beneficiary's own priority, so the scheduler cannot preempt."""
    kube = cluster.kube
    kube.add_gpu_node("gpu-0", node("gpu-0", config="ts-2", gpus=2)["metadata"]["labels"], gpus=4)
    for name in ("a", "b"):
        cluster.pod(name, cluster.batch, "gpu-0", 2, "gpu-test-critical")
        kube.make_running(cluster.batch, name)
    cluster.pod("critical", cluster.serving, None, 2, "gpu-test-critical")
    path = f"/api/v1/namespaces/{cluster.serving}/pods/critical"

    def verdict() -> dict[str, Any] | None:
        for c in kube.get(path).get("status", {}).get("conditions") or []:
            if c["type"] == "PodScheduled" and c["status"] == "False":
                found: dict[str, Any] = c
                return found
        return None

    wait_until("the scheduler's verdict", lambda: verdict() is not None, 60, 0.5)
    condition = verdict()
    assert condition is not None and condition["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in condition["message"]
    reader = ClusterReader(cluster.api, CONFIG)
    reader.state()
    obs = PreemptionReader(cluster.api, CONFIG, reader, cluster.home).observe(time.time())
    (pending,) = [p for p in obs.pods if p.key == f"{cluster.serving}/critical"]
    assert pending.unschedulable_since is not None
    assert abs(pending.unschedulable_since - time.time()) < 120
    decisions, _ = decide_preemption(obs, CONFIG.preemption, time.time() + 600)
    assert decisions == ()  # equal priorities: no victim


def test_a_same_name_replacement_is_never_evicted_and_the_real_server_enforces_the_uid(
    cluster: Cluster,
) -> None:
    """The victim is evicted, a StatefulSet-like controller recreates `train` under the
    same name, and gpuscaler never evicts the new pod; a stale eviction carrying the old
    UID is refused by the API server itself."""
    t0 = time.time() - 400
    cluster.seed(t0 - 60)
    cluster.tick(t0)
    first_uid = cluster.state()["uid"]
    victim = cluster.victim()
    assert victim is not None and victim["metadata"]["uid"] == first_uid
    cluster.tick(t0 + 301)  # evicted; no kubelet: it stays Terminating until deleted
    assert cluster.evictions() == [201]
    cluster.kube.core.delete_namespaced_pod("train", cluster.batch, grace_period_seconds=0)
    replacement = cluster.pod("train", cluster.batch, "gpu-0", 2, "gpu-test-batch")
    cluster.kube.make_running(cluster.batch, "train")
    assert replacement["metadata"]["uid"] != first_uid
    for t in (t0 + 320, t0 + 360, t0 + 500):
        cluster.tick(t)
    assert cluster.state()["tier"] in ("cleanup", "done")
    assert cluster.evictions() == [201]  # the replacement was never evicted
    live = cluster.victim()
    assert live is not None and live["metadata"]["uid"] == replacement["metadata"]["uid"]
    assert not live["metadata"].get("deletionTimestamp")
    # A stale eviction for the old UID: the real server answers 409 and leaves the pod.
    with pytest.raises(ApiException) as refused:
        cluster.kube.request(
            "POST",
            f"/api/v1/namespaces/{cluster.batch}/pods/train/eviction",
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": "train", "namespace": cluster.batch},
                "deleteOptions": {"preconditions": {"uid": first_uid}},
            },
            "application/json",
        )
    assert refused.value.status == 409
    still = cluster.victim()
    assert still is not None and not still["metadata"].get("deletionTimestamp")


def test_a_victim_recreated_under_its_name_is_a_new_pod_and_never_touched(cluster: Cluster) -> None:
    """The real StatefulSet controller recreates `sweep-0` as soon as it is deleted: the
    same name, another uid. The victim is the pod gpuscaler chose, by uid."""
    kube = cluster.kube
    t0 = time.time() - 400
    cluster.seed(t0 - 60)
    kube.core.delete_namespaced_pod("train", cluster.batch, grace_period_seconds=0)
    sweep = deployment("sweep", cluster.batch, 1) | {"kind": "StatefulSet"}
    sweep["spec"]["serviceName"] = "sweep"
    pod = classed_pod("sweep", None, 2, cluster.batch, "gpu-test-batch")  # 2 GPUs
    sweep["spec"]["template"]["spec"] = pod["spec"]
    kube.create(sweep)
    path = f"/api/v1/namespaces/{cluster.batch}/pods/sweep-0"
    wait_until("the StatefulSet makes sweep-0", lambda: bool(kube.get(path)), 30, 0.2)
    kube.bind(cluster.batch, "sweep-0", "gpu-0")  # then Running, as the kubelet reports
    kube.make_running(cluster.batch, "sweep-0")
    chosen = kube.get(path)["metadata"]["uid"]
    _, _, applied = cluster.tick(t0)
    assert [(d.target, d.to_value) for d in applied] == [(f"{cluster.batch}/sweep-0", "soft")]
    cluster.tick(t0 + 301)  # evicted; no kubelet: it stays Terminating
    deleting = datetime.fromisoformat(kube.get(path)["metadata"]["deletionTimestamp"]).timestamp()
    _, _, applied = cluster.tick(deleting + 301)
    assert [d.action for d in steps(applied)] == ["force_delete"]

    def recreated() -> bool:
        try:
            return bool(kube.get(path)["metadata"]["uid"] != chosen)
        except ApiException:
            return False

    wait_until("the StatefulSet recreates sweep-0", recreated, 30, 0.2)
    new = kube.get(path)
    _, _, applied = cluster.tick(deleting + 310)
    assert [d.to_value for d in applied] == ["cleanup"]  # the victim is gone
    after = kube.get(path)
    assert after["metadata"]["uid"] == new["metadata"]["uid"]
    assert not after["metadata"].get("deletionTimestamp")  # the new pod is left alone
    assert "gpuscaler.io/checkpoint-requested" not in (after["metadata"].get("annotations") or {})
