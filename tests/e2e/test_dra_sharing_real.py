"""Fragments and time slices under DRA on the real control plane: the kube-scheduler shares one
device among claims (consumable capacity), gpuscaler reads a pool's fragments and time slice
from the DeviceClass and ResourceClaimTemplate labelled for it, and its decisions change
what NEW claims of those get, nothing else."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from controlplane import Kube, wait_until
from draobjects import API, claim_pod, claim_template, device_class, gpu_slice

from gpuscaler.adapters.kube.actuator import kube_actuator
from gpuscaler.adapters.kube.cluster import (
    SNAPSHOT_COMMAND,
    current_state,
    load_cluster_snapshot,
)
from gpuscaler.adapters.kube.drapools import PENDING_CONFIGMAP
from gpuscaler.adapters.kube.drashare import DECISION
from gpuscaler.adapters.kube.reader import ClusterReader
from gpuscaler.config import Config, parse_config
from gpuscaler.core.decisions import FragmentsDecision, TimeSliceDecision

LABEL = "gpuscaler.io/pool"
RESOURCE = f"/apis/{API}"


def labelled(doc: dict[str, Any], pool: str) -> dict[str, Any]:
    doc["metadata"]["labels"] = {LABEL: pool}
    return doc


def one_pool(kube: Kube, kind: str, fields: str = "", rest: str = "") -> tuple[str, str, Config]:
    """A fresh pool `<kind[0]><tag>` of one DRA node `<kind>-<tag>` (its pool `fields`,
    the config's `rest`): (tag, pool, config)."""
    tag = uuid.uuid4().hex[:6]
    pool = f"{kind[0]}{tag}"
    config = parse_config(
        f"""
node_pools:
  - {{name: {pool}, gpu_memory_gib: 40, {fields}selector: {{label: gpuscaler.test/pool, value: "{tag}"}}}}
{rest}"""
    )
    kube.add_gpu_node(f"{kind}-{tag}", {"gpuscaler.test/pool": tag}, gpus=0)
    return tag, pool, config


def test_a_decision_changes_the_share_and_slice_of_new_claims_that_opted_in_only(
    scheduler: Any, kube: Kube, tmp_path: Path
) -> None:
    ns = kube.namespace()
    tag, pool, config = one_pool(kube, "pdra", rest="kubernetes: {read_timeout: 30s}\n")
    node = f"pdra-{tag}"
    classes = [labelled(device_class(f"gpu-{tag}"), pool), device_class(f"plain-{tag}")]
    for obj in [gpu_slice(node, 1, sharing=True), *classes]:
        kube.create(obj)
        kube.strays.append(kube.path(obj))
    templates = {
        "opted": labelled(claim_template(ns, "opted", cls=f"gpu-{tag}", memory="10Gi"), pool),
        "other": claim_template(ns, "other", cls=f"gpu-{tag}", memory="10Gi"),
        "stranger": labelled(claim_template(ns, "stranger", cls=f"gpu-{tag}", memory="10Gi"), "x"),
    }
    for t in templates.values():
        kube.create(t)

    def claim_of(pod: str) -> dict[str, Any]:
        path = f"/api/v1/namespaces/{ns}/pods/{pod}"
        wait_until(f"{pod} bound", lambda: bool(kube.get(path)["spec"].get("nodeName")), 60, 0.2)
        name = kube.get(path)["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        return kube.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}")

    kube.create(claim_pod("before", ns, template="opted"))
    before = claim_of("before")
    reader = ClusterReader(kube.api, config)
    state = current_state(reader.objects(), config)
    assert (state.fragments[pool], state.time_slice_levels[pool]) == (4, "default")
    dump = tmp_path / "cluster.yaml"  # what `once --cluster-snapshot` reads sees the same
    dump.write_text(kube.plane.kubectl(*SNAPSHOT_COMMAND.split()[1:]))
    assert current_state(load_cluster_snapshot(str(dump), config), config) == state
    untouched = {
        **{n: kube.path(t) for n, t in templates.items() if n != "opted"},
        "plain": kube.path(classes[1]),
        "claim": kube.path(before),
    }
    seen = {n: kube.get(p) for n, p in untouched.items()}

    now = time.time()
    actuator = kube_actuator(kube.api, config, "test", namespace=ns, reader=reader)
    decisions = (
        FragmentsDecision(now, pool, 4, 2, "more GPU per task"),
        TimeSliceDecision(now, pool, "default", "long", "stall"),
    )
    assert actuator.apply(decisions) == decisions

    opted = kube.get(kube.path(templates["opted"]))
    (request,) = opted["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["capacity"]["requests"]["memory"] == "20Gi"
    assert opted["metadata"]["labels"] == {LABEL: pool}
    assert DECISION["fragments"] in opted["metadata"]["annotations"]
    # Its new body was stored before the delete, and dropped once it was created again.
    pending = kube.get(f"/api/v1/namespaces/{ns}/configmaps/{PENDING_CONFIGMAP}")
    assert not pending.get("data")
    (entry,) = kube.get(kube.path(classes[0]))["spec"]["config"]
    assert entry["opaque"]["driver"] == "gpu.nvidia.com"
    assert entry["opaque"]["parameters"]["sharing"] == {
        "strategy": "TimeSlicing",
        "timeSlicingConfig": {"interval": "Long"},
    }
    for name, path in untouched.items():  # never written: same version, same content
        assert kube.get(path) == seen[name], name

    kube.create(claim_pod("after", ns, template="opted"))
    kube.create(claim_pod("plain", ns, template="other"))
    after, plain = claim_of("after"), claim_of("plain")
    results = [c["status"]["allocation"]["devices"] for c in (before, after, plain)]
    assert [(r["results"][0]["device"], r["results"][0]["consumedCapacity"]) for r in results] == [
        ("gpu-0", {"memory": "10Gi"}),
        ("gpu-0", {"memory": "20Gi"}),
        ("gpu-0", {"memory": "10Gi"}),
    ]
    assert [c["source"] for c in results[1]["config"]] == ["FromClass"]
    assert results[1]["config"][0]["opaque"]["parameters"] == entry["opaque"]["parameters"]
    assert "config" not in results[0]  # allocated before the class had any

    reader.last_objects = None
    state = current_state(reader.objects(), config)
    assert (state.fragments[pool], state.time_slice_levels[pool]) == (2, "long")
    assert actuator.apply(decisions) == ()  # already there: nothing written


def test_under_mps_fragments_set_the_classs_thread_percentage_and_no_time_slice(
    kube: Kube,
) -> None:
    ns = kube.namespace()
    tag, pool, config = one_pool(kube, "mps", fields="sharing: mps, ")
    node = f"mps-{tag}"
    cls = labelled(device_class(f"mps-{tag}"), pool)
    mps = {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "10Gi"}}
    params = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": mps}
    cls["spec"]["config"] = [{"opaque": {"driver": "gpu.nvidia.com", "parameters": params}}]
    for obj in (gpu_slice(node, 1, sharing=True), cls):
        kube.create(obj)
        kube.strays.append(kube.path(obj))
    kube.create(labelled(claim_template(ns, "quarter", cls=f"mps-{tag}", memory="10Gi"), pool))
    now = time.time()
    actuator = kube_actuator(kube.api, config, "test", namespace=ns)
    fragments = FragmentsDecision(now, pool, 4, 2, "more GPU per task")
    assert actuator.apply(
        [fragments, TimeSliceDecision(now, pool, "default", "long", "stall")]
    ) == (fragments,)
    (entry,) = kube.get(kube.path(cls))["spec"]["config"]
    assert entry["opaque"]["parameters"]["sharing"]["mpsConfig"] == {
        "defaultPinnedDeviceMemoryLimit": "10Gi",
        "defaultActiveThreadPercentage": 50,
    }
    template = kube.get(f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates/quarter")
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["capacity"]["requests"]["memory"] == "20Gi"
