"""End to end on the real control plane (tests/controlplane.py): the real kube-scheduler,
configured by the shipped deploy/scheduler/kube-scheduler-config.yaml (its urlPrefix
pointed at 127.0.0.1, its client kubeconfig added, and mutual TLS on as the chart's
scheduler.tls renders it), calls `gpuscaler extender` as deployed, which reads GPU memory
from a real Prometheus scraping dcgm-style series.

Nodes are API objects (no kubelet); the extender binds, the API server records it."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import controlplane as cp
import pytest
import yaml
from builders import CLI
from extenderkit import MIB, DcgmExporter
from kubemeta import annotations_of
from kubeobjects import bare_pod
from kubepki import make_mutual_tls_dir
from promserver import free_port, prometheus

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "scheduler" / "kube-scheduler-config.yaml"
RBAC = ROOT / "deploy" / "scheduler" / "extender-rbac.yaml"
FULL = MIB - 512 - 100  # a GPU with next to nothing free


def _in_namespace(path: Path, namespace: str) -> str:
    """The shipped manifests with their `gpuscaler` namespace replaced, rules unchanged."""
    docs = list(yaml.safe_load_all(path.read_text()))
    for doc in docs:
        if doc["metadata"].get("namespace") == "gpuscaler":
            doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects", []):
            subject["namespace"] = namespace
    return yaml.safe_dump_all(docs)


class GpuScheduler:
    """Prometheus + exporter + extender + second kube-scheduler, for one module."""

    def __init__(self, plane: cp.ControlPlane, workdir: Path):
        self.plane, self.dir = plane, workdir
        self.exporter = DcgmExporter()
        self.procs: list[Any] = []
        self.tls = workdir / "tls"  # one certificate for both ends, as a Secret mounts it
        self.tls.mkdir()
        make_mutual_tls_dir(self.tls, "gpu-scheduler", ["localhost"])
        self.ssl = ssl.create_default_context(cafile=self.tls / "ca.crt")
        self.ssl.load_cert_chain(self.tls / "tls.crt", self.tls / "tls.key")

    def node(self, kube: cp.Kube, used: list[float], per_numa: int | None = None,
             topology: list[int] | None = None) -> str:  # fmt: skip
        name = f"gpu-{uuid.uuid4().hex[:6]}"
        for i, u in enumerate(used):
            self.exporter.gpu(name, i, u)
        labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
        if per_numa is not None:
            labels["gpuscaler.io/gpus-per-numa-node"] = str(per_numa)
        annotations = None
        if topology is not None:
            entries = [
                {"uuid": f"GPU-{name}-{i}", "index": i, "numa_node": n}
                for i, n in enumerate(topology)
            ]
            annotations = {"gpuscaler.io/gpu-topology": json.dumps(entries)}
        kube.add_gpu_node(name, labels, gpus=len(used), annotations=annotations)
        return name

    def start(self, prom: str) -> None:
        port, self.metrics = free_port(), free_port()
        cfg = self.dir / "gpuscaler.yaml"
        tls = f"tls_cert_file: {self.tls}/tls.crt, tls_key_file: {self.tls}/tls.key"
        cfg.write_text(
            f"prometheus: {{url: '{prom}'}}\nscheduler: {{cache_ttl: 1s, node_resync: 1s, "
            f"{tls}, client_ca_file: {self.tls}/ca.crt}}\n"
        )
        # as deployed: the extender's ServiceAccount with the shipped RBAC, nothing more
        self.kube = cp.Kube(self.plane)
        home = self.kube.namespace()  # not `gpuscaler`: other modules install there
        self.rbac = self.dir / "extender-rbac.yaml"
        self.rbac.write_text(_in_namespace(RBAC, home))
        self.plane.kubectl("apply", "-f", str(self.rbac))
        kubeconfig = self.plane.token_kubeconfig(
            home, "gpuscaler-extender", self.dir / "extender.kubeconfig"
        )
        env = os.environ | {"POD_NAME": "extender-e2e", "POD_NAMESPACE": home}
        self.extender = subprocess.Popen(
            [*CLI, "extender", "--config", str(cfg), "--port", str(port), "--host", "127.0.0.1",
             "--kubeconfig", str(kubeconfig), "--metrics-port", str(self.metrics)],
            stdout=subprocess.PIPE, stderr=(self.dir / "extender.log").open("w"), text=True, env=env,
        )  # fmt: skip
        self.url = f"https://127.0.0.1:{port}"
        cp.wait_until("extender ready", self._ready, 60, 0.25)
        ksc = yaml.safe_load(SHIPPED.read_text())
        files = {"certFile": "tls.crt", "keyFile": "tls.key", "caFile": "ca.crt"}
        ksc["extenders"][0] |= {
            "urlPrefix": self.url,
            "enableHTTPS": True,
            "tlsConfig": {k: str(self.tls / v) for k, v in files.items()},
        }
        ksc["leaderElection"]["resourceNamespace"] = "kube-system"
        ksc["clientConnection"] = {"kubeconfig": str(self.plane.admin_kubeconfig)}
        (self.dir / "ksc.yaml").write_text(yaml.safe_dump(ksc))
        secure = free_port()
        self.scheduler = cp.Process(
            "gpu-scheduler",
            [str(self.plane.bin / "kube-scheduler"), f"--config={self.dir / 'ksc.yaml'}",
             f"--authentication-kubeconfig={self.plane.admin_kubeconfig}",
             f"--authorization-kubeconfig={self.plane.admin_kubeconfig}",
             "--bind-address=127.0.0.1", f"--secure-port={secure}", "--v=2"],
            self.dir / "gpu-scheduler.log",
        )  # fmt: skip
        self.plane._wait_http(self.scheduler, f"https://127.0.0.1:{secure}/healthz", cp._insecure())

    def _ready(self) -> bool:
        if self.extender.poll() is not None:
            raise RuntimeError((self.dir / "extender.log").read_text()[-2000:])
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics}/readyz", timeout=2) as r:
            return bool(r.status == 200)

    def stop(self) -> None:
        if hasattr(self, "scheduler"):
            self.scheduler.stop()
        if hasattr(self, "extender"):
            self.extender.send_signal(signal.SIGTERM)
            self.extender.wait(30)
        self.exporter.close()
        if hasattr(self, "kube"):
            self.plane.kubectl("delete", "-f", str(self.rbac), "--wait=false", check=False)
            self.kube.cleanup()


@pytest.fixture(scope="module")
def gpu_scheduler(
    control_plane: cp.ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GpuScheduler]:
    s = GpuScheduler(control_plane, tmp_path_factory.mktemp("gpu-scheduler"))
    try:
        with prometheus(scrape_target=f"127.0.0.1:{s.exporter.port}") as url:
            s.exporter.gpu("warm-up", 0, 0.0)
            s.start(url)
            yield s
    finally:
        s.stop()
    log = (s.dir / "extender.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    assert s.extender.returncode == 0, log[-3000:]
    assert "HTTP 403" not in log, log[-3000:]  # the shipped RBAC allowed every call


def _pod(kube: cp.Kube, ns: str, name: str, memory: int, count: int = 1) -> None:
    doc = bare_pod(name, ns, schedulerName="gpu-scheduler")
    annotations = {"gpu-scheduler/memory-mb": str(memory), "gpu-scheduler/gpu-count": str(count)}
    doc["metadata"]["annotations"] = annotations
    kube.create(doc)


def _node_of(kube: cp.Kube, ns: str, name: str) -> str | None:
    spec = kube.core.read_namespaced_pod(name, ns).spec
    return None if spec is None else spec.node_name


def _wait_bound(kube: cp.Kube, ns: str, name: str, timeout: float = 60) -> str:
    cp.wait_until(f"pod {name} bound", lambda: _node_of(kube, ns, name) is not None, timeout, 0.5)
    node = _node_of(kube, ns, name)
    assert node is not None
    return node


def _failed_scheduling(kube: cp.Kube, ns: str, name: str) -> str:
    events = kube.core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name}")
    return " ".join(e.message or "" for e in events.items if e.reason == "FailedScheduling")


def _wait_fresh(s: GpuScheduler, nodes: list[str]) -> None:
    """The extender knows the new nodes (metrics scraped, node objects re-read)."""

    def known() -> bool:
        body = json.dumps({"Pod": {"metadata": {"annotations": {"gpu-scheduler/memory-mb": "1"}},
                                   "spec": {"schedulerName": "gpu-scheduler"}},
                           "NodeNames": nodes}).encode()  # fmt: skip
        request = urllib.request.Request(s.url + "/filter", body, method="POST")
        with urllib.request.urlopen(request, timeout=5, context=s.ssl) as r:
            return bool(json.loads(r.read())["NodeNames"] == nodes)

    cp.wait_until("extender sees the nodes", known, 60, 0.5)


def test_a_pod_lands_on_the_node_the_formula_prefers(
    gpu_scheduler: GpuScheduler, kube: cp.Kube
) -> None:
    s = gpu_scheduler
    # the design's example: 8 GPUs at 40 % (score 0.6 x 100 -> 6) against a node as free
    # in total but uneven, half its GPUs full (stddev 0.5 -> 0.6 x 50 -> 3)
    even = s.node(kube, [0.4 * MIB] * 8)
    uneven = s.node(kube, [FULL, FULL, FULL, FULL, 0, 0, 0, 0])
    _wait_fresh(s, [even, uneven])
    ns = kube.namespace()
    _pod(kube, ns, "llm", 8192)
    assert _wait_bound(kube, ns, "llm") == even
    pod = kube.core.read_namespaced_pod("llm", ns)
    assert annotations_of(pod)["gpu-scheduler/reserved-mb"] == "8192"


def test_a_pod_no_node_can_hold_stays_pending_with_the_extenders_reason(
    gpu_scheduler: GpuScheduler, kube: cp.Kube
) -> None:
    s = gpu_scheduler
    node = s.node(kube, [0.5 * MIB] * 2)
    _wait_fresh(s, [node])
    ns = kube.namespace()
    _pod(kube, ns, "huge", 30000)

    reason = "too few GPUs with the memory per GPU the pod asks for"
    said = lambda: reason in _failed_scheduling(kube, ns, "huge")  # noqa: E731
    cp.wait_until("FailedScheduling event with the extender's reason", said, 60, 0.5)
    assert _node_of(kube, ns, "huge") is None


def test_two_pods_racing_for_one_slot_are_never_both_bound(
    gpu_scheduler: GpuScheduler, kube: cp.Kube
) -> None:
    s = gpu_scheduler
    node = s.node(kube, [0.0, FULL])  # one GPU holds one 30,000 MiB pod (36,352 usable)
    _wait_fresh(s, [node])
    ns = kube.namespace()
    for name in ("race-a", "race-b"):
        _pod(kube, ns, name, 30000)
    winner = None
    deadline = time.monotonic() + 60
    while winner is None and time.monotonic() < deadline:
        bound = [n for n in ("race-a", "race-b") if _node_of(kube, ns, n)]
        winner = bound[0] if bound else None
        time.sleep(0.5)
    assert winner is not None
    time.sleep(8)  # the loser has had several scheduling attempts by now
    assert [n for n in ("race-a", "race-b") if _node_of(kube, ns, n)] == [winner]
    annotations = annotations_of(kube.core.read_namespaced_pod(winner, ns))
    assert annotations["gpu-scheduler/reserved-mb"] == "30000"  # bound by the extender


def test_a_4_gpu_pod_prefers_the_node_with_4_gpus_in_one_numa_domain(
    gpu_scheduler: GpuScheduler, kube: cp.Kube
) -> None:
    s = gpu_scheduler
    # the same memory use on both: four GPUs free, four full. On `packed` the four free
    # ones share NUMA node 0 (agent's topology annotation); on `split` two are on each
    # node (the gpus-per-numa-node label fallback).
    packed = s.node(kube, [0, 0, 0, 0, FULL, FULL, FULL, FULL], topology=[0, 0, 0, 0, 1, 1, 1, 1])
    split = s.node(kube, [0, 0, FULL, FULL, 0, 0, FULL, FULL], per_numa=4)
    _wait_fresh(s, [packed, split])
    ns = kube.namespace()
    _pod(kube, ns, "tp4", 4 * 20000, count=4)
    assert _wait_bound(kube, ns, "tp4") == packed
    record = annotations_of(kube.core.read_namespaced_pod("tp4", ns))
    reserved = json.loads(record["gpu-scheduler/reservation"])["gpus"]
    assert sorted(reserved) == [f"GPU-{packed}-{i}" for i in range(4)]  # all on NUMA node 0


@pytest.mark.parametrize(
    ("scheduler", "bound", "annotated", "reason"),
    [
        ("other-scheduler", False, True, "pod's schedulerName 'other-scheduler' is not 'gpu-scheduler'"),
        ("gpu-scheduler", True, True, "pod is already bound to node "),
        ("gpu-scheduler", False, False, "pod has no annotation gpu-scheduler/memory-mb"),
    ],
    ids=["another scheduler's", "bound", "without annotations"],
)  # fmt: skip
def test_the_extender_binds_only_unbound_annotated_pods_of_the_gpu_scheduler(
    gpu_scheduler: GpuScheduler, kube: cp.Kube, scheduler: str, bound: bool, annotated: bool,
    reason: str,
) -> None:  # fmt: skip
    s = gpu_scheduler
    node, other = s.node(kube, [0.0]), s.node(kube, [0.0])
    _wait_fresh(s, [node, other])
    ns = kube.namespace()
    doc = bare_pod("p", ns, other if bound else None, schedulerName=scheduler)
    doc["metadata"]["annotations"] = {"gpu-scheduler/memory-mb": "1000"} if annotated else {}
    created = kube.create(doc)
    binding = {"PodName": "p", "PodNamespace": ns, "PodUID": created["metadata"]["uid"]}
    request = urllib.request.Request(
        s.url + "/bind", json.dumps(binding | {"Node": node}).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=10, context=s.ssl) as r:  # as anyone could
        error = json.loads(r.read())["Error"]
    assert error == f"pod {ns}/p: {reason}" + (other if bound else "")
    if not annotated:  # the real scheduler's Filter call is refused the same way
        said = lambda: reason in _failed_scheduling(kube, ns, "p")  # noqa: E731
        cp.wait_until("FailedScheduling event", said, 60, 0.5)
    pod = kube.core.read_namespaced_pod("p", ns)
    assert _node_of(kube, ns, "p") == (other if bound else None)
    assert "gpu-scheduler/reserved-mb" not in annotations_of(pod)
