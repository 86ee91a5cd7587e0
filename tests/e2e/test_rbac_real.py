"""RBAC for real: deploy/rbac.yaml applied to the real kube-apiserver (RBAC authorizer),
gpuscaler run as its ServiceAccount with a TokenRequest token (not as admin). Every call
of a scenario that walks the Kubernetes code paths is allowed; an ungranted call is
refused with 403 and reported as a clear error, not a traceback."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from builders import NOW
from controlplane import ROOT, ControlPlane, Kube, Recorder, wait_until
from draobjects import claim_template, device_class, gpu_slice
from kubemeta import labels_of
from kubeobjects import (
    classed_pod,
    gpu_pod,
    hpa,
    node,
    plugin_configmap,
    priority_class,
    scaled_object,
)
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException
from test_rbac import walk_the_tiers

from gpuscaler.adapters.kube.actuator import kube_actuator
from gpuscaler.adapters.kube.preemption_reader import PreemptionReader
from gpuscaler.adapters.kube.reader import ClusterReader
from gpuscaler.config import ConfigError, parse_config
from gpuscaler.controller.assembly import cluster_controller
from gpuscaler.core.decisions import (
    FragmentsDecision,
    ReplicaFloorDecision,
    TimeSliceDecision,
)
from gpuscaler.leader import LeaderElector

HOME = "gpuscaler"  # the Deployment's namespace (POD_NAMESPACE)
CONFIG = """
prometheus: {url: "http://127.0.0.1:1", timeout: 1s, retries: 0}
preemption: {checkpoint_endpoint: "http://{pod_ip}:9/checkpoint"}
kubernetes: {config_propagation: 0s}  # the walk covers every call; the wait is tested elsewhere
node_pools:
  - {name: a100, gpu_memory_gib: 80, selector: {label: nvidia.com/gpu.product, value: NVIDIA-A100-SXM4-80GB}}
  - {name: dra, gpu_memory_gib: 40, selector: {label: gpuscaler.test/pool, value: rbac-dra}}
workloads:
  - {namespace: ml, kind: ScaledObject, name: chat}
  - {namespace: ml, kind: HorizontalPodAutoscaler, name: embed}
"""


def _as_service_account(
    plane: ControlPlane, tmp: Path, name: str = "gpuscaler"
) -> client.ApiClient:
    kubeconfig = plane.token_kubeconfig(HOME, name, tmp / f"{name}.kubeconfig")
    api: client.ApiClient = kube_config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig)
    )
    return api


def _opted(doc: dict[str, Any]) -> dict[str, Any]:
    doc["metadata"]["labels"] = {"gpuscaler.io/pool": "dra"}
    return doc


def _seed(kube: Kube) -> None:
    for ns in (HOME, "nvidia-device-plugin", "ml", "batch", "serving"):
        kube.namespace(ns)
    kube.plane.kubectl("apply", "-f", str(ROOT / "deploy" / "rbac.yaml"))
    kube.create(plugin_configmap({}))
    for i in range(2):
        kube.seed([node(f"gpu-{i}")])
    kube.create(scaled_object("chat", 2))
    kube.create(hpa("embed", 1))
    for name, value in (("gpu-test-batch", 10), ("gpu-test-critical", 1_000_000)):
        kube.ensure(priority_class(name, value))


def test_as_its_service_account_every_call_gpuscaler_makes_is_allowed(
    kube: Kube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _seed(kube)
    config = parse_config(CONFIG)
    api = _as_service_account(kube.plane, tmp_path)
    record = Recorder(api)
    monkeypatch.setenv("POD_NAME", "gpuscaler-abc")
    monkeypatch.setenv("POD_NAMESPACE", HOME)
    reader = ClusterReader(api, config)
    reader.state()
    assert reader.healthy
    actuator = kube_actuator(api, config, "gpuscaler-abc", namespace=HOME)
    decisions = (
        FragmentsDecision(NOW, "a100", 2, 4, "r"),
        TimeSliceDecision(NOW, "a100", "medium", "long", "r"),
        ReplicaFloorDecision(NOW, "ml/ScaledObject/chat", 2, 5, "r"),
        ReplicaFloorDecision(NOW, "ml/HorizontalPodAutoscaler/embed", 1, 3, "r"),
    )
    assert actuator.apply(decisions) == decisions
    elector = LeaderElector(api, HOME, "gpuscaler-abc", config.kubernetes.lease)
    assert elector.step()  # create
    assert elector.step()  # get, update
    elector.release()
    parts = cluster_controller(config, api, dry_run=True, config_path="/nonexistent/config.yaml")
    assert parts.reloader is not None
    parts.reloader.on_refused(ConfigError("c.yaml", ["x: bad"]))  # the refusal Event
    assert parts.cache is not None  # the watch cache lists and watches as this account
    parts.reader.objects()
    wait_until(
        "every informer watching",
        lambda: all(i.watches > 0 for i in parts.cache.informers.values() if not i.absent),
        30,
    )
    parts.stop()

    # Preemption, every tier: a critical pod cannot be scheduled, a batch pod holds gpu-1.
    chat = gpu_pod("chat-1", "gpu-0", 1)  # gpu-0 is not free either; never a victim
    chat["metadata"]["annotations"] = {"gpuscaler.io/preemptible": "false"}
    kube.seed([chat])
    victim = kube.create(classed_pod("train", "gpu-1", 16, "batch", "gpu-test-batch"))
    kube.make_running("batch", "train")
    kube.patch("/api/v1/namespaces/batch/pods/train/status", {"status": {"podIP": "127.0.0.1"}})
    kube.create(classed_pod("critical", None, 16, "serving", "gpu-test-critical"))
    kube.mark_unschedulable("serving", "critical", "2020-01-01T00:00:00Z")
    reader.state()
    preemption = PreemptionReader(api, config, reader, HOME)
    now = time.time()  # the server stamped the pods with the real time
    walk_the_tiers(actuator, preemption.observe(now), config, now)
    with pytest.raises(ApiException) as gone:
        kube.core.read_namespaced_pod("train", "batch")
    assert gone.value.status == 404 and victim["metadata"]["uid"]

    # Sharing under DRA: the opted-in class patched, the opted-in template replaced.
    kube.add_gpu_node("rbac-dra-0", {"gpuscaler.test/pool": "rbac-dra"}, gpus=0)
    for doc in (gpu_slice("rbac-dra-0", 1, sharing=True), device_class("rbac-shared")):
        kube.create(doc if doc["kind"] == "ResourceSlice" else _opted(doc))
        kube.strays.append(kube.path(doc))
    kube.create(_opted(claim_template("ml", "quarter", memory="10Gi")))
    sharing = (
        FragmentsDecision(NOW, "dra", 4, 2, "r"),
        TimeSliceDecision(NOW, "dra", "default", "long", "r"),
    )
    assert actuator.apply(sharing) == sharing

    refused = [c for c in record.calls if c[2] in (401, 403)]
    assert refused == []
    verbs = {(m, p.split("/")[-1] if "/" in p else p) for m, p, _ in record.calls}
    assert ("POST", "eviction") in verbs and ("PUT", "gpuscaler-leader") in verbs
    assert len(record.calls) > 40


def test_an_ungranted_call_is_refused_with_403_and_reported_clearly(
    kube: Kube, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _seed(kube)
    kube.create(
        plugin_configmap({})
        | {
            "metadata": {
                "name": "other",
                "namespace": "nvidia-device-plugin",
                "labels": {"gpuscaler.io/enabled": "true"},
            }
        }
    )
    # The Role grants the device-plugin ConfigMap by name: point gpuscaler at another one.
    config = parse_config(
        CONFIG.replace(
            "kubernetes: {config_propagation: 0s}",
            "kubernetes: {device_plugin_config_map: {namespace: nvidia-device-plugin, name: other}}",
        )
    )
    api = _as_service_account(kube.plane, tmp_path)
    actuator = kube_actuator(api, config, "gpuscaler-abc", namespace=HOME)
    with caplog.at_level(logging.WARNING, "gpuscaler.kubernetes"):
        applied = actuator.apply([FragmentsDecision(NOW, "a100", 2, 4, "r")])
    assert applied == ()
    (line,) = [r.getMessage() for r in caplog.records if "not applied" in r.getMessage()]
    assert "read ConfigMap nvidia-device-plugin/other: HTTP 403 Forbidden" in line
    assert 'cannot get resource "configmaps"' in line  # the server's reason, not a traceback
    assert "system:serviceaccount:gpuscaler:gpuscaler" in line
    labels = labels_of(kube.core.read_node("gpu-0"))
    assert labels["nvidia.com/device-plugin.config"] == "ts-2"  # nothing half-applied


def test_a_service_account_without_grants_gets_a_clear_error_from_the_cli(
    kube: Kube, tmp_path: Path
) -> None:
    kube.namespace(HOME)
    kube.core.create_namespaced_service_account(
        HOME, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="nobody"))
    )
    kubeconfig = kube.plane.token_kubeconfig(HOME, "nobody", tmp_path / "nobody.kubeconfig")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG)
    gpuscaler = str(Path(sys.executable).parent / "gpuscaler")
    out = subprocess.run(
        [gpuscaler, "once", "--dry-run", "--config", str(cfg), "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    messages = [json.loads(line)["msg"] for line in out.stderr.splitlines() if line.startswith("{")]
    refused, *skips = [m for m in messages if "HTTP 403" in m]  # the read, then each target
    assert all("no action" in m for m in skips)
    assert "list Node: HTTP 403 Forbidden" in refused
    assert 'User "system:serviceaccount:gpuscaler:nobody" cannot list resource "nodes"' in refused
