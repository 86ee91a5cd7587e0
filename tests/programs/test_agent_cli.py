"""`gpuscaler agent` as deployed: a separate process with its documented arguments (node
name from NODE_NAME, as the DaemonSet's downward API sets it), against the API server,
with the fake NVML file, a fake nvidia-smi on PATH, a pod-resources socket, and real
processes to clean up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agentkit import (
    BUS0,
    BUS1,
    GPU0,
    GPU1,
    SELF,
    agent_pod,
    calls,
    cgroupfs_v1,
    fake_node,
    fake_nvidia_smi,
    pod_resources_server,
    systemd_v2,
    terminate,
)
from builders import http_get, run_cli
from controlplane import wait_until
from kubefake import FakeCluster, fake_apiserver, kubeconfig_for
from promserver import free_port
from test_agent import GONE, LIVE, NODE, node_object, pod

from gpuscaler.adapters.node import CLEANUP_LABEL, GPU_TOPOLOGY, TIME_SLICE_APPLIED

GPUSCALER = str(Path(sys.executable).parent / "gpuscaler")
SHIPPED = str(Path(__file__).parents[2] / "config" / "gpuscaler.yaml")


def kubeconfig(directory: Path, url: str) -> Path:
    directory.mkdir(exist_ok=True)
    return kubeconfig_for(url, directory / "kubeconfig")


def _node(cluster: FakeCluster) -> dict[str, Any]:
    found = cluster.get("v1", "nodes", None, NODE)
    assert found is not None
    return found


def test_gpuscaler_agent_runs_as_documented_and_cleans_up_after_an_eviction(
    tmp_path: Path,
) -> None:
    with fake_node() as node, fake_apiserver() as (url, cluster):
        node.add_gpu(GPU0, 0, BUS0, numa=1)
        node.add_gpu(GPU1, 1, BUS1, numa=1)
        smi_log = fake_nvidia_smi(node.root / "bin")
        labels = {"gpuscaler.io/enabled": "true", "gpuscaler.io/time-slice": "long"}
        cluster.add("v1", "nodes", node_object(labels, quarantined=True))
        cluster.add("v1", "pods", pod("serving", LIVE, NODE))
        cluster.add("v1", "pods", agent_pod(NODE))
        live = node.start(systemd_v2(LIVE), GPU1, 20000)
        orphan = node.start(cgroupfs_v1(GONE), GPU0, 6000)
        devices = [
            {"name": "serving", "namespace": "ml", "containers": {"m": {"nvidia.com/gpu": [GPU1]}}}
        ]
        with pod_resources_server(devices) as socket:
            config = tmp_path / "agent.yaml"
            config.write_text(
                f"agent:\n  poll_interval: 500ms\n  orphan_grace: 2s\n  kill_timeout: 2s\n"
                f"  proc_root: {node.proc}\n  sys_root: {node.sys}\n"
                f"  pod_resources_socket: {socket}\n"
            )
            port = free_port()
            env = {
                **os.environ,
                "NODE_NAME": NODE,
                "POD_UID": SELF,
                "PATH": f"{node.root / 'bin'}:{os.environ['PATH']}",
            }
            agent = subprocess.Popen(
                [GPUSCALER, "agent", "--config", str(config), "--metrics-port", str(port),
                 "--kubeconfig", str(kubeconfig(tmp_path / "kc", url)),
                 "--metrics-host", "127.0.0.1", "--fake-nvml", str(node.nvml_file)],
                env=env, stdout=subprocess.DEVNULL,
                stderr=(tmp_path / "agent.log").open("w"),  # a file: a full pipe cannot stall it
            )  # fmt: skip
            base = f"http://127.0.0.1:{port}"
            try:
                wait_until("readyz", lambda: http_get(base + "/readyz")[0] == 200, 30)
                assert node.alive(orphan)  # inside its grace
                wait_until("the orphan killed", lambda: not node.alive(orphan), 30)
                wait_until("the taint lifted", lambda: not _node(cluster)["spec"]["taints"][1:], 30)
                status, metrics = http_get(base + "/metrics")
                health, _ = http_get(base + "/healthz")
            finally:
                terminate(agent)
        said = (tmp_path / "agent.log").read_text()
        assert agent.returncode == 0, said
        assert node.alive(live)
        stored = _node(cluster)
        assert CLEANUP_LABEL not in stored["metadata"]["labels"]
        annotations = stored["metadata"]["annotations"]
        assert annotations[TIME_SLICE_APPLIED] == "long"
        assert [g["numa_node"] for g in json.loads(annotations[GPU_TOPOLOGY])] == [1, 1]
        assert sorted(calls(smi_log)) == [
            f"compute-policy -i {GPU0} --set-timeslice 3",
            f"compute-policy -i {GPU1} --set-timeslice 3",
        ]
        reasons = {o["reason"] for (_, p, _, _), o in cluster.objects.items() if p == "events"}
        assert {
            "OrphanGPUProcessKilled",
            "OrphanGPUMemoryFreed",
            "GPUMemoryReleased",
            "TimeSliceApplied",
        } <= reasons
        assert (status, health) == (200, 200)
        assert f'gpuscaler_agent_pod_gpu_device{{container="m",device="{GPU1}"' in metrics
        assert f"agent on node {NODE}: acting" in said


def test_without_a_node_name_the_agent_exits_2_saying_so(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    argv = [GPUSCALER, "agent", "--config", SHIPPED]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2
    assert "--node NAME or set NODE_NAME" in out.stderr and "Traceback" not in out.stderr


def test_a_bad_agent_section_exits_2_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("agent:\n  orphan_grace: soon\n  kill_timeout: 0s\n")
    out = run_cli("agent", "--config", str(config), "--node", NODE)
    assert out.returncode == 2
    assert "agent.orphan_grace" in out.stderr and "agent.kill_timeout" in out.stderr
    assert "Traceback" not in out.stderr


def test_without_nvml_the_agent_exits_2_saying_so(tmp_path: Path) -> None:
    with fake_apiserver() as (url, _cluster):
        kc = str(kubeconfig(tmp_path / "kc", url))
        argv = [GPUSCALER, "agent", "--config", SHIPPED, "--node", NODE, "--kubeconfig", kc]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "no NVML" in out.stderr and "Traceback" not in out.stderr
