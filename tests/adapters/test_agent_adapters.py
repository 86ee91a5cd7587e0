"""The agent's adapters on their own: NVML's translation (against a stand-in `pynvml`
module with the binding's names and error classes), the host readers, nvidia-smi, the
pod-resources client, and bench/gpu_check.sh on a machine without a GPU."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
from agentkit import GPU0, GPU1, calls, fake_nvidia_smi, pod_resources_server

from gpuscaler.adapters.host import HostFs
from gpuscaler.adapters.nvidia_smi import set_timeslice
from gpuscaler.adapters.nvml import MIB, NvmlError, RealNvml
from gpuscaler.adapters.podresources import PodResourcesError, gpu_of_device, list_pods

ROOT = Path(__file__).resolve().parents[2]


def stand_in_pynvml(mig_supported: bool) -> types.ModuleType:
    """The names nvidia-ml-py exports that RealNvml uses, over two GPUs."""
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    class NotSupported(NVMLError):
        pass

    m.NVMLError = NVMLError  # type: ignore[attr-defined]
    m.NVML_DEVICE_MIG_ENABLE = 1  # type: ignore[attr-defined]
    handles = {0: "h0", 1: "h1"}
    uuids = {"h0": GPU0.encode(), "h1": GPU1}  # older bindings return bytes
    ns = types.SimpleNamespace
    m.nvmlInit = lambda: None  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = lambda: 2  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = handles.__getitem__  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByUUID = lambda u: "h0" if u == GPU0 else "h1"  # type: ignore[attr-defined]
    m.nvmlDeviceGetUUID = uuids.__getitem__  # type: ignore[attr-defined]
    m.nvmlDeviceGetPciInfo = lambda h: ns(  # type: ignore[attr-defined]
        busId=b"00000000:3B:00.0" if h == "h0" else "00000000:AF:00.0"
    )
    m.nvmlDeviceGetMemoryInfo = lambda h: ns(total=81920 * MIB, used=512 * MIB)  # type: ignore[attr-defined]

    def mig(h: str) -> tuple[int, int]:
        if not mig_supported:
            raise NotSupported("Not Supported")
        return (1, 1) if h == "h1" else (0, 0)

    m.nvmlDeviceGetMigMode = mig  # type: ignore[attr-defined]

    def procs(h: str) -> list[Any]:
        if h == "h1":
            raise NVMLError("GPU is lost")
        return [ns(pid=42, usedGpuMemory=2048 * MIB), ns(pid=43, usedGpuMemory=None)]

    m.nvmlDeviceGetComputeRunningProcesses = procs  # type: ignore[attr-defined]
    return m


@pytest.mark.parametrize("mig_supported", [True, False])
def test_real_nvml_translates_the_bindings_answers(
    monkeypatch: pytest.MonkeyPatch, mig_supported: bool
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", stand_in_pynvml(mig_supported))
    nvml = RealNvml()
    gpus = nvml.gpus()
    assert [
        (g.uuid, g.index, g.pci_bus_id, g.memory_total_mib, g.memory_used_mib) for g in gpus
    ] == [
        (GPU0, 0, "00000000:3B:00.0", 81920, 512.0),
        (GPU1, 1, "00000000:AF:00.0", 81920, 512.0),
    ]
    assert [g.mig for g in gpus] == [False, mig_supported]
    assert [(p.pid, p.used_mib) for p in nvml.processes(gpus[0])] == [(42, 2048.0), (43, None)]
    with pytest.raises(NvmlError, match="GPU is lost"):
        nvml.processes(gpus[1])


@pytest.mark.parametrize("pidfd", ["pidfd_open", "ENOSYS: the start time checked before kill"])
def test_host_reads_start_time_numa_and_signals_only_the_same_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pidfd: str
) -> None:
    if pidfd.startswith("ENOSYS"):

        def no_pidfd(pid: int, flags: int = 0) -> int:  # a kernel before 5.3
            raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

        monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        proc = tmp_path / "proc" / str(child.pid)
        proc.mkdir(parents=True)
        stat = Path(f"/proc/{child.pid}/stat").read_text()
        (proc / "stat").write_text(stat)
        host = HostFs(tmp_path / "proc", tmp_path / "sys")
        start = host.start_time(child.pid)
        assert start == int(stat.rsplit(")", 1)[1].split()[19])
        assert host.signal(child.pid, start + 1, signal.SIGTERM) == "reused"  # the PID reused
        time.sleep(0.2)
        assert child.poll() is None
        assert host.signal(child.pid, start, signal.SIGTERM) == "sent"
        child.wait(timeout=10)
        assert host.signal(child.pid, start, signal.SIGTERM) == "gone"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    numa = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:3b:00.0"
    numa.mkdir(parents=True)
    (numa / "numa_node").write_text("1\n")
    assert host.numa_node("00000000:3B:00.0") == 1
    assert host.numa_node("00000000:AF:00.0") == -1  # no such device
    (numa / "numa_node").write_text("garbage\n")
    assert host.numa_node("00000000:3B:00.0") == -1
    assert host.cgroup(999_999_999) is None and host.start_time(999_999_999) is None


def test_nvidia_smi_is_called_with_the_uuid_and_level_and_failures_are_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = fake_nvidia_smi(tmp_path / "ok")
    monkeypatch.setenv("PATH", f"{tmp_path / 'ok'}:{os.environ['PATH']}")
    assert set_timeslice("nvidia-smi", GPU0, 2, 5).ok
    assert calls(log) == [f"compute-policy -i {GPU0} --set-timeslice 2"]
    assert not set_timeslice("nvidia-smi", GPU0, 4, 5).ok  # never passed on
    assert len(calls(log)) == 1
    missing = set_timeslice("no-such-nvidia-smi", GPU0, 1, 5)
    assert not missing.ok and "not found on PATH" in missing.detail
    slow = tmp_path / "slow" / "nvidia-smi"
    slow.parent.mkdir()
    slow.write_text("#!/bin/sh\nsleep 5\n")
    slow.chmod(0o755)
    timed_out = set_timeslice(str(slow), GPU0, 1, 0.5)
    assert not timed_out.ok and "timed out" in timed_out.detail


def test_pod_resources_list_over_a_unix_socket() -> None:
    pods = [
        {
            "name": "p",
            "namespace": "ns",
            "containers": {"c": {"nvidia.com/gpu": [f"{GPU0}::3", GPU1]}},
        }
    ]
    with pod_resources_server([*pods, {"name": "web", "namespace": "ns"}]) as socket:
        answer = list_pods(socket, 5)
    assert answer.pods == {"ns/p", "ns/web"}
    devices = answer.devices
    assert [(d.namespace, d.pod, d.container, d.device_id) for d in devices] == [
        ("ns", "p", "c", f"{GPU0}::3"),
        ("ns", "p", "c", GPU1),
    ]
    assert gpu_of_device(f"{GPU0}::3") == GPU0 and gpu_of_device(GPU1) == GPU1
    with pytest.raises(PodResourcesError, match="UNAVAILABLE"):
        list_pods("/tmp/no-such-kubelet.sock", 2)


def test_gpu_check_runs_without_a_gpu_and_prints_a_result_line() -> None:
    out = subprocess.run(
        [str(ROOT / "bench" / "gpu_check.sh")], capture_output=True, text=True, timeout=120
    )
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT gpu="), out.stdout + out.stderr
    if "gpu=absent" in last:
        assert out.returncode == 0 and "no GPU here" in out.stderr
    else:  # a machine with a GPU: the real paths ran
        assert "gpu-topology:" in out.stdout
