"""`once --cluster-snapshot` and `run` end to end: a real Prometheus with an hour of
planted dcgm-exporter series, a realistic kubectl dump (also seeded on the real control plane by
tests/e2e/test_as_deployed.py, which runs `run` against it)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from builders import run_cli
from promserver import planted_window, prometheus, write_openmetrics

SNAPSHOT = Path(__file__).parents[1] / "data" / "cluster-snapshot.yaml"
POINTS = 7200
START, END = planted_window(POINTS, 20)  # set again by the fixture that plants them


def _wave(i: int) -> float:
    return 1.5 * math.sin(i * 0.7) + 0.8 * math.sin(i * 0.13)


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with planted_prometheus(tmp_path_factory.mktemp("prom")) as url:
        yield url


@contextmanager
def planted_prometheus(directory: Path) -> Iterator[str]:
    """A real Prometheus holding the last hour of the planted series, ending just now."""
    a100 = {"modelName": "NVIDIA A100-SXM4-80GB", "gpu": "0"}
    a0, a1 = ({**a100, "Hostname": f"gpu-a100-{i}", "UUID": f"GPU-a{i}"} for i in (0, 1))
    # a GPU outside the configured pools, so the pool itself stays idle
    h100 = {"modelName": "NVIDIA H100 80GB HBM3", "Hostname": "gpu-h100-0", "gpu": "1"}
    h100 |= {"UUID": "GPU-a2", "namespace": "ml", "pod": "chat-7d9f6c5b8-x2k9q"}
    series: dict[str, list[tuple[dict[str, str], Any]]] = {
        "DCGM_FI_DEV_GPU_UTIL": [
            (a0, lambda i: 15 + _wave(i)),
            (a1, lambda i: 17 - _wave(i)),
            (h100, lambda i: 100 + 150 * i / POINTS + _wave(i)),
        ],
        "nvidia_gpu_stall_percentage": [(a0, lambda i: 3.0)],
    }
    data = directory / "data.om"
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
        ("apiVersion: v1\nkind: List\nitems:\n- {kind: Node, metadata: {name: n}}\n", (), "no Pod objects"),
        ("- just\n- a list\n", (), "is not a Kubernetes object"),
        ("kind: List\nitems:\n- {kind: Node, metadata: {name: n, labels: {nvidia.com/gpu.count: eight}}}\n- {kind: Pod, metadata: {name: p}}\n", (), "nvidia.com/gpu.count: 'eight' is not a whole number"),
        (SNAPSHOT.read_text(), ("--no-dry-run",), "add --dry-run"),
    ],
    ids=["truncated YAML", "a partial dump without pods", "not objects", "a garbage label", "no --dry-run"],
)  # fmt: skip
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


# `run` against a cluster: tests/e2e/test_as_deployed.py, on the real control plane.
