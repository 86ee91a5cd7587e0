"""`once --cluster-snapshot` and `run` end to end: a real Prometheus with an hour of
planted dcgm-exporter series, the fake Kubernetes API seeded from a realistic kubectl dump."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import run_cli
from kubefake import FakeCluster, fake_apiserver
from kubeobjects import plugin_configmap
from promserver import planted_window, prometheus, write_openmetrics

from gpuscaler.adapters.kubernetes import sharing_config

SNAPSHOT = Path(__file__).parent / "data" / "cluster-snapshot.yaml"
POINTS = 7200
START, END = planted_window(POINTS, 20)  # set again by the fixture that plants them


PLURALS = {
    "PriorityClass": ("scheduling.k8s.io/v1", "priorityclasses"),
    "PodDisruptionBudget": ("policy/v1", "poddisruptionbudgets"),
    "Node": ("v1", "nodes"),
    "Pod": ("v1", "pods"),
    "ScaledObject": ("keda.sh/v1alpha1", "scaledobjects"),
    "HorizontalPodAutoscaler": ("autoscaling/v2", "horizontalpodautoscalers"),
}


def _wave(i: int) -> float:
    return 1.5 * math.sin(i * 0.7) + 0.8 * math.sin(i * 0.13)


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    a100 = {"modelName": "NVIDIA A100-SXM4-80GB"}
    series: dict[str, list[tuple[dict[str, str], Any]]] = {
        "DCGM_FI_DEV_GPU_UTIL": [
            (
                {**a100, "Hostname": "gpu-a100-0", "gpu": "0", "UUID": "GPU-a0"},
                lambda i: 15 + _wave(i),
            ),
            (
                {**a100, "Hostname": "gpu-a100-1", "gpu": "0", "UUID": "GPU-a1"},
                lambda i: 17 - _wave(i),
            ),
            (
                {  # on a GPU outside the configured pools, so the pool itself stays idle
                    "modelName": "NVIDIA H100 80GB HBM3",
                    "Hostname": "gpu-h100-0",
                    "gpu": "1",
                    "UUID": "GPU-a2",
                    "namespace": "ml",
                    "pod": "chat-7d9f6c5b8-x2k9q",
                },
                lambda i: 100 + 150 * i / POINTS + _wave(i),
            ),
        ],
        "nvidia_gpu_stall_percentage": [
            ({**a100, "Hostname": "gpu-a100-0", "gpu": "0", "UUID": "GPU-a0"}, lambda i: 3.0)
        ],
    }
    data = tmp_path_factory.mktemp("prom") / "data.om"
    global START, END
    START, END = planted_window(POINTS, 20)
    write_openmetrics(data, series, START, POINTS)
    with prometheus(data) as url:
        yield url


def _config(tmp: Path, url: str, extra: str = "") -> Path:
    path = tmp / "gpuscaler.yaml"
    path.write_text(
        f"""
control: {{interval: 2s}}
prometheus: {{url: "{url}", timeout: 5s, retries: 1}}
fragments: {{sustain: 0s}}
replicas: {{skill_check: false}}  # one tick has no skill verdict; these test the adapters
node_pools:
  - name: a100-80gb
    selector: {{label: nvidia.com/gpu.product, value: NVIDIA-A100-SXM4-80GB}}
    gpu_memory_gib: 80
    metrics_matchers: {{modelName: NVIDIA A100-SXM4-80GB}}
  - name: l4-24gb
    selector: {{label: nvidia.com/gpu.product, value: NVIDIA-L4}}
    gpu_memory_gib: 24
    sharing: mps
    metrics_matchers: {{modelName: NVIDIA L4}}
workloads:
  - {{namespace: ml, kind: ScaledObject, name: chat, node_pool: a100-80gb}}
{extra}"""
    )
    return path


def _lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_once_dry_run_plans_against_a_kubectl_dump(prom_url: str, tmp_path: Path) -> None:
    cfg = _config(tmp_path, prom_url)
    out = run_cli("once", "--config", str(cfg), "--dry-run", "--cluster-snapshot", str(SNAPSHOT))
    assert out.returncode == 0, out.stderr
    lines = _lines(out.stdout)
    decisions = {(d["kind"], d["target"]): d for d in lines if "skipped" not in d}
    fragments = decisions[("fragments", "a100-80gb")]
    assert (fragments["from"], fragments["to"], fragments["outcome"]) == (2, 4, "dry_run")
    floor = decisions[("replica_floor", "ml/ScaledObject/chat")]
    assert floor["from"] == 2 and floor["to"] > 2 and floor["outcome"] == "dry_run"
    skips = {(s["kind"], s["target"]): s["reason"] for s in lines if s.get("skipped")}
    # The L4 pool has no metrics; the embedder HPA is discovered by its label, has no data.
    assert "no series matches" in skips[("fragments", "l4-24gb")]
    assert ("replica_floor", "ml/HorizontalPodAutoscaler/embedder") in skips
    assert not any("web" in target for _, target in skips)  # not opted in
    # research/train-llama-0 (gpu-critical, 4 GPUs) is Unschedulable: sweep-a frees room on
    # gpu-a100-0 (sweep-b on gpu-a100-1 is protected by a PDB), after asking to checkpoint.
    preempt = decisions[("preemption", "research/sweep-a-0")]
    assert (preempt["from"], preempt["to"], preempt["outcome"]) == ("none", "soft", "dry_run")
    assert preempt["detail"]["beneficiary"] == "research/train-llama-0"
    assert preempt["detail"]["node"] == "gpu-a100-0"
    assert preempt["detail"]["checkpoint_deadline"] > time.time()


@pytest.mark.parametrize(
    ("content", "extra_args", "message"),
    [
        ("items: [\n  - {kind: Node", (), "not valid YAML at line"),
        (
            "apiVersion: v1\nkind: List\nitems:\n- {kind: Node, metadata: {name: n}}\n",
            (),
            "no Pod objects",
        ),
        ("- just\n- a list\n", (), "is not a Kubernetes object"),
        (
            "kind: List\nitems:\n- {kind: Node, metadata: {name: n, labels: {nvidia.com/gpu.count: eight}}}\n- {kind: Pod, metadata: {name: p}}\n",
            (),
            "nvidia.com/gpu.count: 'eight' is not a whole number",
        ),
        (SNAPSHOT.read_text(), ("--no-dry-run",), "add --dry-run"),
    ],
    ids=[
        "truncated YAML",
        "a partial dump without pods",
        "not objects",
        "a garbage label",
        "no --dry-run",
    ],
)
def test_a_bad_cluster_snapshot_is_a_clear_error(
    prom_url: str, tmp_path: Path, content: str, extra_args: tuple[str, ...], message: str
) -> None:
    cfg = _config(tmp_path, prom_url)
    dump = tmp_path / "dump.yaml"
    dump.write_text(content)
    dry = [] if "--no-dry-run" in extra_args else ["--dry-run"]
    out = run_cli("once", "--config", str(cfg), *dry, "--cluster-snapshot", str(dump))
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def _seed(cluster: FakeCluster) -> None:
    for item in yaml.safe_load(SNAPSHOT.read_text())["items"]:
        gv, plural = PLURALS[item["kind"]]
        cluster.add(gv, plural, item)
    cluster.add("v1", "configmaps", plugin_configmap({"ts-2": sharing_config("time-slicing", 2)}))


def _kubeconfig(tmp: Path, url: str) -> Path:
    path = tmp / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "me", "user": {"token": "t"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}],
                "current-context": "fake",
            }
        )
    )
    return path


def test_run_acts_on_the_cluster_as_leader(prom_url: str, tmp_path: Path) -> None:
    cfg = _config(tmp_path, prom_url)
    with fake_apiserver() as (url, cluster):
        _seed(cluster)
        env_before = dict(os.environ)
        os.environ.update({"POD_NAME": "gpuscaler-abc", "POD_NAMESPACE": "gpuscaler"})
        try:
            out = run_cli(
                "run",
                "--config",
                str(cfg),
                "--kubeconfig",
                str(_kubeconfig(tmp_path, url)),
                "--max-ticks",
                "2",
                "--metrics-port",
                "0",
            )
        finally:
            os.environ.clear()
            os.environ.update(env_before)
        assert out.returncode == 0, out.stderr[-3000:]
        so = cluster.get("keda.sh/v1alpha1", "scaledobjects", "ml", "chat")
        assert so is not None and so["spec"]["minReplicaCount"] > 2
        assert "gpuscaler.io/last-decision" in so["metadata"]["annotations"]
        keda_hpa = cluster.get("autoscaling/v2", "horizontalpodautoscalers", "ml", "keda-hpa-chat")
        assert keda_hpa is not None and keda_hpa["spec"]["minReplicas"] == 2  # never KEDA's HPA
        for name in ("gpu-a100-0", "gpu-a100-1"):
            node = cluster.get("v1", "nodes", None, name)
            assert node is not None
            assert node["metadata"]["labels"]["nvidia.com/device-plugin.config"] == "ts-4"
        cm = cluster.get("v1", "configmaps", "nvidia-device-plugin", "gpuscaler-sharing-configs")
        assert cm is not None and "ts-4" in cm["data"]
        lease = cluster.get("coordination.k8s.io/v1", "leases", "gpuscaler", "gpuscaler-leader")
        assert lease is not None
        assert lease["spec"].get("holderIdentity") is None  # released on a clean stop
        reasons = sorted(
            o["reason"] for (_, p, _, _), o in cluster.objects.items() if p == "events"
        )
        assert reasons.count("FragmentsChanged") == 2
        assert "ReplicaFloorChanged" in reasons and "SharingConfigAdded" in reasons
        victim = cluster.get("v1", "pods", "research", "sweep-a-0")
        assert victim is not None
        assert "gpuscaler.io/checkpoint-requested" in victim["metadata"]["annotations"]
        web = cluster.get("autoscaling/v2", "horizontalpodautoscalers", "frontend", "web")
        assert web is not None and "annotations" not in web["metadata"]
