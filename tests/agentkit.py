"""What the node agent's tests stand on, with no GPU: real processes mapped to pods by fake
cgroup files under a temporary /proc, a temporary /sys, a fake NVML file, a fake
`nvidia-smi` on PATH that records its arguments, and an in-test kubelet pod-resources
gRPC server on a unix socket (every fake node has one: `Node.socket`, answering
`Node.kubelet`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gpuscaler.adapters.kubelet_pb import api_pb2, api_pb2_grpc

GPU0 = "GPU-11111111-2222-3333-4444-555555555555"
GPU1 = "GPU-66666666-7777-8888-9999-aaaaaaaaaaaa"
BUS0, BUS1 = "00000000:3B:00.0", "00000000:AF:00.0"
SELF = "5e1f5e1f-0000-4000-8000-000000000001"
"""The agent's own pod UID (POD_UID): the pod list must hold it to be trusted."""


def agent_pod(node: str, uid: str = SELF) -> dict[str, Any]:
    """The agent's own pod on `node`, as the API lists it."""
    meta = {"name": "gpuscaler-agent-x", "namespace": "gpuscaler-agent", "uid": uid}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": node}}


def systemd_v2(uid: str, qos: str = "burstable") -> str:
    """A container's cgroup line under the systemd driver, cgroup v2 (kubelet naming)."""
    escaped = uid.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{escaped}.slice/"
        "cri-containerd-0123456789abcdef.scope\n"
    )


def cgroupfs_v1(uid: str, qos: str = "besteffort") -> str:
    lines = [
        f"12:memory:/kubepods/{qos}/pod{uid}/0123456789abcdef",
        f"4:devices:/kubepods/{qos}/pod{uid}/0123456789abcdef",
        f"1:name=systemd:/kubepods/{qos}/pod{uid}/0123456789abcdef",
    ]
    return "\n".join(lines) + "\n"


HOST_CGROUP = "0::/system.slice/nvidia-persistenced.service\n"
MPS_CGROUP = "0::/system.slice/nvidia-mps.service\n"


@dataclass
class Node:
    """A fake node: /proc and /sys trees, an NVML file, real processes."""

    root: Path
    gpus: list[dict[str, Any]] = field(default_factory=list)
    procs: list[dict[str, Any]] = field(default_factory=list)
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)
    kubelet: list[dict[str, Any]] = field(default_factory=list)
    """The pods the kubelet runs, as pod-resources answers them (see `pod_resources_server`)."""
    socket: str = ""

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    @property
    def sys(self) -> Path:
        return self.root / "sys"

    @property
    def nvml_file(self) -> Path:
        return self.root / "nvml.json"

    def add_gpu(self, uuid: str, index: int, bus: str, numa: int | None, **extra: Any) -> None:
        self.gpus.append(
            {
                "uuid": uuid,
                "index": index,
                "pci_bus_id": bus,
                "memory_total_mib": 81920,
                "base_used_mib": 300,
                **extra,
            }
        )
        if numa is not None:
            bdf = bus[4:].lower()  # 00000000:3B:00.0 -> 0000:3b:00.0
            d = self.sys / "bus" / "pci" / "devices" / bdf
            d.mkdir(parents=True, exist_ok=True)
            (d / "numa_node").write_text(f"{numa}\n")
        self._write()

    def start(
        self,
        cgroup: str,
        gpu: str,
        used_mib: float,
        name: str = "python3",
        ignore_sigterm: bool = False,
    ) -> int:
        """A real process on `gpu` for NVML, in the cgroup `cgroup` for /proc; SIGTERM
        ends it unless `ignore_sigterm` (then only SIGKILL does)."""
        code = "import signal, time\n"
        if ignore_sigterm:
            code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        code += "print('ready', flush=True)\ntime.sleep(600)\n"
        child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        self.children.append(child)
        pid = child.pid
        d = self.proc / str(pid)
        d.mkdir(parents=True)
        (d / "cgroup").write_text(cgroup)
        (d / "stat").write_text(Path(f"/proc/{pid}/stat").read_text())
        (d / "comm").write_text(name + "\n")
        self.procs.append({"pid": pid, "gpu": gpu, "used_mib": used_mib})
        self._write()
        return pid

    def _write(self) -> None:
        self.nvml_file.write_text(json.dumps({"gpus": self.gpus, "processes": self.procs}))

    def alive(self, pid: int) -> bool:
        child = next(c for c in self.children if c.pid == pid)
        return child.poll() is None

    def stop(self) -> None:
        for c in self.children:
            if c.poll() is None:
                c.kill()
            c.wait(timeout=10)


@contextmanager
def fake_node() -> Iterator[Node]:
    node = Node(Path(tempfile.mkdtemp(prefix="agent-", dir="/tmp")))
    try:
        with pod_resources_server(node.kubelet) as node.socket:
            yield node
    finally:
        node.stop()
        shutil.rmtree(node.root, ignore_errors=True)


def fake_nvidia_smi(directory: Path, exit_code: int = 0) -> Path:
    """An `nvidia-smi` that appends its arguments (one call a line) to `calls.log` and
    exits `exit_code` (non-zero with the message real nvidia-smi prints without root)."""
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "calls.log"
    script = directory / "nvidia-smi"
    fail = f'echo "Insufficient Permissions" >&2; exit {exit_code}' if exit_code else "exit 0"
    script.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\n{fail}\n')
    script.chmod(0o755)
    return log


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


# --------------------------------------------------------------------------- pod-resources


class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, pods: list[dict[str, Any]]):
        self.pods = pods

    def List(self, request: Any, context: Any) -> Any:  # the gRPC method name
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(
                    name=p["name"],
                    namespace=p["namespace"],
                    containers=[
                        api_pb2.ContainerResources(
                            name=c,
                            devices=[
                                api_pb2.ContainerDevices(resource_name=r, device_ids=ids)
                                for r, ids in devices.items()
                            ],
                        )
                        for c, devices in p.get("containers", {}).items()
                    ],
                )
                for p in self.pods
            ]
        )


@contextmanager
def pod_resources_server(pods: list[dict[str, Any]]) -> Iterator[str]:
    """A kubelet pod-resources `List` on a unix socket; yields the socket path."""
    directory = tempfile.mkdtemp(prefix="podres-", dir="/tmp")  # unix paths: 108 bytes max
    path = os.path.join(directory, "kubelet.sock")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(pods), server)  # type: ignore[no-untyped-call]
    server.add_insecure_port(f"unix://{path}")
    server.start()
    try:
        yield path
    finally:
        server.stop(grace=None).wait(timeout=10)
        shutil.rmtree(directory, ignore_errors=True)


def terminate(process: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
