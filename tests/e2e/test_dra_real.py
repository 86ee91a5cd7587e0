"""GPUs allocated by DRA on the real control plane: ResourceSlices published as a driver
would (no kubelet or node plugin is needed to allocate), the real kube-scheduler
allocating the claims, the claim controller making them from templates, and gpuscaler's
watch cache and listing reader turning it all into the preemption observation."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from controlplane import Kube, wait_until
from draobjects import DRIVER, claim_pod, claim_template, device_class, gpu_slice
from kubeobjects import priority_class
from steps import steps

from gpuscaler.adapters.kube.actuator import kube_actuator
from gpuscaler.adapters.kube.cache import CachedClusterReader, CachedPreemptionReader, ClusterCache
from gpuscaler.adapters.kube.preemption_reader import PreemptionReader
from gpuscaler.adapters.kube.reader import ClusterReader
from gpuscaler.config import Config, parse_config
from gpuscaler.core.decisions import Decision
from gpuscaler.core.preemption import DeviceHold, PreemptionObservation, decide_preemption

SEEN = 60.0
"""Seconds for the scheduler to allocate and bind and the cache to see it (about 1 idle)."""


class Cluster:
    """One test's mixed cluster: a device-plugin node and a DRA node in pool `a`."""

    def __init__(self, kube: Kube):
        self.kube = kube
        self.ns = kube.namespace()
        tag = uuid.uuid4().hex[:6]
        self.plugin_node, self.dra_node = f"plugin-{tag}", f"dra-{tag}"
        self.config: Config = parse_config(
            f"""
node_pools:
  - {{name: a, gpu_memory_gib: 80, selector: {{label: gpuscaler.test/pool, value: "{tag}"}}}}
preemption: {{enabled: true}}
kubernetes: {{read_timeout: 30s}}
"""
        )
        self.labels = labels = {"gpuscaler.test/pool": tag}
        kube.add_gpu_node(self.plugin_node, labels, gpus=4)
        kube.add_gpu_node(self.dra_node, labels, gpus=0)
        self.publish(gpu_slice(self.dra_node, 2))
        kube.ensure(device_class())
        kube.create(claim_template(self.ns, "one-gpu"))
        self.cache = ClusterCache(kube.api, self.ns, self.config.kubernetes).start()
        self.cached = CachedPreemptionReader(
            kube.api,
            self.config,
            CachedClusterReader(kube.api, self.config, self.cache),
            self.ns,
            cache=self.cache,
        )
        self.listed = PreemptionReader(
            kube.api, self.config, ClusterReader(kube.api, self.config), self.ns
        )

    def publish(self, obj: dict[str, Any]) -> None:
        """A cluster-scoped object, deleted after the test."""
        self.kube.create(obj)
        self.kube.strays.append(self.kube.path(obj))

    def pod(self, name: str, template: str | None = "one-gpu", gpus: int = 0) -> str:
        doc = claim_pod(name, self.ns, template=template)
        if gpus:
            doc["spec"] = {
                "containers": [
                    {
                        "name": "main",
                        "image": "x",
                        "resources": {"limits": {"nvidia.com/gpu": gpus}},
                    }
                ]
            }
        return str(self.kube.create(doc)["metadata"]["uid"])

    def bound(self, name: str) -> str:
        def node() -> str:
            return str(
                self.kube.get(f"/api/v1/namespaces/{self.ns}/pods/{name}")["spec"].get("nodeName")
                or ""
            )

        wait_until(f"pod {name} bound", lambda: bool(node()), SEEN, 0.2)
        return node()

    def observed(self, reader: PreemptionReader, *names: str) -> PreemptionObservation:
        """The observation once it shows the pods `names` holding what they were given."""
        seen: list[PreemptionObservation] = []

        def shows() -> bool:
            reader.cluster.last_objects = None  # read afresh, as a tick does
            seen[:] = [reader.observe(time.time())]
            keys = {p.key: p for p in seen[0].pods}
            return all(
                (p := keys.get(f"{self.ns}/{n}")) is not None and p.node is not None and p.gpus
                for n in names
            )

        wait_until("observation", shows, SEEN, 0.2)
        return seen[0]


@pytest.fixture
def cluster(scheduler: Any, kube: Kube) -> Iterator[Cluster]:
    c = Cluster(kube)
    try:
        yield c
    finally:
        c.cache.stop()


def test_a_mixed_cluster_shows_the_plugins_and_dras_gpus_with_holder_node_and_capacity(
    cluster: Cluster,
) -> None:
    c = cluster
    dra_uid = c.pod("dra-holder")
    c.pod("plugin-holder", template=None, gpus=2)
    assert c.bound("dra-holder") == c.dra_node
    assert c.bound("plugin-holder") == c.plugin_node
    claim = c.kube.get(f"/apis/resource.k8s.io/v1/namespaces/{c.ns}/resourceclaims")["items"][0]
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [dra_uid]
    for reader in (c.cached, c.listed):
        seen = c.observed(reader, "dra-holder", "plugin-holder")
        pods = {p.key: p for p in seen.pods if p.namespace == c.ns}
        dra, plugin = pods[f"{c.ns}/dra-holder"], pods[f"{c.ns}/plugin-holder"]
        assert (dra.node, dra.gpus, dra.uid) == (c.dra_node, 1, dra_uid)
        assert dra.devices == (
            DeviceHold(
                DRIVER,
                c.dra_node,
                result["device"],
                f"{c.ns}/{claim['metadata']['name']}",
                c.dra_node,
                1.0,
                40.0,
            ),
        )
        assert (plugin.node, plugin.gpus, plugin.devices) == (c.plugin_node, 2, ())
        nodes = {n.name: n for n in seen.nodes}
        assert (nodes[c.dra_node].shares, nodes[c.plugin_node].shares) == (2, 4)
        reserve = c.config.fragments.memory_reserve_ratio
        assert nodes[c.dra_node].share_memory_gib == pytest.approx(40 * (1 - reserve))


def test_a_pod_waiting_for_a_dra_gpu_is_seen_wanting_it(cluster: Cluster) -> None:
    c = cluster
    c.kube.create(claim_template(c.ns, "three-gpus", count=3))  # the node has 2
    c.pod("waiting", template="three-gpus")

    def waiting() -> bool:
        c.cached.cluster.last_objects = None
        pods = {p.key: p for p in c.cached.observe(time.time()).pods}
        p = pods.get(f"{c.ns}/waiting")
        return p is not None and p.gpus == 3 and p.unschedulable_since is not None

    wait_until("the waiting pod seen unschedulable, wanting 3 GPUs", waiting, SEEN, 0.2)
    assert c.kube.get(f"/api/v1/namespaces/{c.ns}/pods/waiting")["spec"].get("nodeName") is None


def test_two_claims_sharing_one_device_are_each_seen_holding_their_part(cluster: Cluster) -> None:
    c = cluster
    node = f"{c.dra_node}-shared"
    c.kube.add_gpu_node(node, {"gpuscaler.test/pool": "shared"}, gpus=0)
    c.publish(gpu_slice(node, 1, sharing=True))
    c.kube.create(claim_template(c.ns, "quarter", memory="10Gi"))
    spec_node = {"nodeSelector": {"gpuscaler.test/pool": "shared"}}
    for name in ("first", "second"):
        doc = claim_pod(name, c.ns, template="quarter")
        doc["spec"] |= spec_node
        c.kube.create(doc)
    assert c.bound("first") == c.bound("second") == node
    seen = c.observed(c.cached, "first", "second")
    pods = {p.key: p.devices for p in seen.pods if p.namespace == c.ns}
    assert [(h.device, h.node, h.share, h.memory_gib) for d in pods.values() for h in d] == [
        ("gpu-0", node, 0.25, 10.0)
    ] * 2
    assert len({h.claim for d in pods.values() for h in d}) == 2


def _tick(c: Cluster, config: Config, now: float) -> tuple[Decision, ...]:
    """Read, decide, act, with fresh adapter objects each time (as after a restart)."""
    reader = ClusterReader(c.kube.api, config)
    obs = PreemptionReader(c.kube.api, config, reader, c.ns).observe(now)
    decisions, _ = decide_preemption(obs, config.preemption, now)
    return kube_actuator(c.kube.api, config, "test", namespace=c.ns).apply(decisions)


def _preempting(c: Cluster) -> Config:
    """The cluster's config evicting at once (no kubelet finishes a graceful deletion),
    and the PriorityClasses of the preemption tests."""
    for name, value in (("gpu-dra-batch", 10), ("gpu-dra-mid", 100), ("gpu-dra-critical", 10**6)):
        c.kube.ensure(priority_class(name, value))
    at_once = c.config.preemption.model_copy(update={"eviction_grace_period": 0.0})
    return c.config.model_copy(update={"preemption": at_once})


def _unschedulable(c: Cluster, name: str) -> None:
    path = f"/api/v1/namespaces/{c.ns}/pods/{name}"

    def verdict() -> bool:
        conditions = c.kube.get(path).get("status", {}).get("conditions") or []
        return any(x["type"] == "PodScheduled" and x["status"] == "False" for x in conditions)

    wait_until("the scheduler's Unschedulable verdict", verdict, SEEN, 0.2)


def _allocated(c: Cluster, pod: str) -> list[tuple[str, Any]]:
    """(device, consumed capacity) of the claim made for `pod`."""
    claims = c.kube.get(f"/apis/resource.k8s.io/v1/namespaces/{c.ns}/resourceclaims")["items"]
    (mine,) = [x for x in claims if x["metadata"]["name"].startswith(f"{pod}-")]
    results = mine["status"]["allocation"]["devices"]["results"]
    return [(r["device"], r.get("consumedCapacity")) for r in results]


def test_a_pod_waiting_on_a_dra_claim_gets_the_device_its_preempted_holder_frees(
    cluster: Cluster,
) -> None:
    """Both DRA GPUs held by low-priority pods, a critical pod's claim waits: the real
    scheduler does not preempt for it; gpuscaler evicts the holder a PDB does not protect,
    waits for the claim controller to release its device, and the real scheduler then
    allocates that device to the waiting claim and binds the pod."""
    c = cluster
    config = _preempting(c)
    for name, cls in (("spared", "gpu-dra-batch"), ("victim", "gpu-dra-mid")):
        doc = claim_pod(name, c.ns, template="one-gpu")
        doc["metadata"]["labels"] = {"app": name}
        doc["spec"] |= {"priorityClassName": cls}
        c.kube.create(doc)
        assert c.bound(name) == c.dra_node
        c.kube.make_running(c.ns, name)
    c.kube.create(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "spared", "namespace": c.ns},
            "spec": {"selector": {"matchLabels": {"app": "spared"}}, "minAvailable": 1},
        }
    )
    pdb = f"/apis/policy/v1/namespaces/{c.ns}/poddisruptionbudgets/spared"
    wait_until(
        "the PDB counted", lambda: "currentHealthy" in c.kube.get(pdb).get("status", {}), SEEN, 0.2
    )
    held = {p.key: p.devices for p in c.observed(c.listed, "victim").pods}
    (victim_device,) = [h.device for h in held[f"{c.ns}/victim"]]
    doc = claim_pod("critical", c.ns, template="one-gpu")
    doc["spec"] |= {"priorityClassName": "gpu-dra-critical"}
    c.kube.create(doc)
    _unschedulable(c, "critical")
    t0 = time.time() + 60  # past pending_for
    applied = _tick(c, config, t0)
    assert [(d.target, d.to_value) for d in applied] == [(f"{c.ns}/victim", "soft")]
    assert f"{DRIVER}/{c.dra_node}/{victim_device}" in applied[0].reason
    assert "1 DRA GPU device(s)" in applied[0].reason
    applied = _tick(c, config, t0 + 301)  # soft grace over
    assert [(d.to_value, d.action) for d in steps(applied)] == [("hard", "evict")]
    # The real scheduler binds the waiting pod to the device the victim's claim held, once
    # the claim controller released it; gpuscaler's record closes after that.
    assert c.bound("critical") == c.dra_node
    assert [device for device, _ in _allocated(c, "critical")] == [victim_device]
    assert [d.to_value for d in _tick(c, config, t0 + 310)] == ["cleanup"]
    applied = _tick(c, config, t0 + 310 + 121)  # no dcgm series: memory not measurable
    assert [d.to_value for d in applied] == ["done"]
    assert "not verified" in applied[0].reason and "DRA claim" not in applied[0].reason
    spared = c.kube.get(f"/api/v1/namespaces/{c.ns}/pods/spared")
    assert not spared["metadata"].get("deletionTimestamp")
    assert not (spared["metadata"].get("annotations") or {})


def test_a_claim_for_half_a_shared_device_preempts_one_of_its_two_sharers(
    cluster: Cluster,
) -> None:
    """Consumable capacity: two low-priority claims hold 20Gi each of one 40Gi GPU, a
    critical claim asks for 20Gi. One sharer (the lower priority) is enough, and the real
    scheduler gives the critical claim the 20Gi it frees on the same device."""
    c = cluster
    config = _preempting(c)
    node = f"{c.dra_node}-shared"
    c.kube.add_gpu_node(node, c.labels | {"gpuscaler.test/node": node}, gpus=0)
    c.publish(gpu_slice(node, 1, sharing=True))
    c.kube.create(claim_template(c.ns, "half", memory="20Gi"))
    here = {"nodeSelector": {"gpuscaler.test/node": node}}
    for name, cls in (
        ("low", "gpu-dra-batch"),
        ("mid", "gpu-dra-mid"),
        ("critical", "gpu-dra-critical"),
    ):
        doc = claim_pod(name, c.ns, template="half")
        doc["spec"] |= {"priorityClassName": cls} | here
        c.kube.create(doc)
        if name != "critical":
            assert c.bound(name) == node
    _unschedulable(c, "critical")
    t0 = time.time() + 60
    applied = _tick(c, config, t0)
    assert [(d.target, d.to_value) for d in applied] == [(f"{c.ns}/low", "soft")]
    assert f"{DRIVER}/{node}/gpu-0" in applied[0].reason
    applied = _tick(c, config, t0 + 301)
    assert [(d.target, d.action) for d in steps(applied)] == [(f"{c.ns}/low", "evict")]
    assert c.bound("critical") == node
    assert _allocated(c, "critical") == [("gpu-0", {"memory": "20Gi"})]
    mid = c.kube.get(f"/api/v1/namespaces/{c.ns}/pods/mid")
    assert mid["spec"]["nodeName"] == node and not mid["metadata"].get("deletionTimestamp")
