"""NVML adapter: the GPUs of this node and their compute processes, behind a small typed
interface (`Nvml`), with the real library (nvidia-ml-py, imported as `pynvml`) and a fake
read from a JSON file (tests, and `gpuscaler agent --fake-nvml FILE` for the as-deployed
test; no GPU is needed).

NVML calls used (NVML API reference, "Device Queries"): nvmlDeviceGetCount,
nvmlDeviceGetHandleByIndex, nvmlDeviceGetUUID, nvmlDeviceGetPciInfo (busId),
nvmlDeviceGetMemoryInfo (bytes), nvmlDeviceGetMigMode (NotSupported on GPUs without MIG),
nvmlDeviceGetComputeRunningProcesses (pid, usedGpuMemory in bytes or None when the driver
cannot tell, e.g. without privileges or under some vGPU modes). A GPU is the core's
`GpuFacts` with `pci_bus_id` as NVML writes it (8-digit domain, upper case, e.g.
00000000:3B:00.0) and `numa_node` -1: the agent reads NUMA from sysfs.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpuscaler.core.node_agent import GpuFacts

MIB = 1024 * 1024


class NvmlError(Exception):
    """NVML is missing or failed; the message says which call."""


@dataclass(frozen=True)
class Process:
    pid: int
    gpu: str
    used_mib: float | None


class Nvml(Protocol):
    def gpus(self) -> list[GpuFacts]: ...

    def processes(self, gpu: GpuFacts) -> list[Process]: ...


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's `00000000:3B:00.0` as sysfs names it, `0000:3b:00.0` (domain 4 hex digits,
    lower case). Raises ValueError on anything else."""
    parts = nvml_bus_id.strip().split(":")
    if len(parts) != 3 or "." not in parts[2]:
        raise ValueError(f"not a PCI bus id: {nvml_bus_id!r}")
    domain, bus = int(parts[0], 16), int(parts[1], 16)
    device, function = (int(x, 16) for x in parts[2].split(".", 1))
    if domain > 0xFFFF or bus > 0xFF or device > 0x1F or function > 0x7:
        raise ValueError(f"PCI bus id out of range: {nvml_bus_id!r}")
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RealNvml:
    """nvidia-ml-py. Initialised once; every error becomes NvmlError naming the call."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as e:  # pragma: no cover - a dependency
            raise NvmlError(f"nvidia-ml-py is not installed: {e}") from None
        self._nvml: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise NvmlError(f"nvmlInit: {e} (is the NVIDIA driver visible here?)") from None

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError as e:
            raise NvmlError(f"{what}: {e}") from None

    def _mig(self, handle: Any) -> bool:
        try:
            current, _pending = self._nvml.nvmlDeviceGetMigMode(handle)
        except self._nvml.NVMLError:  # NotSupported: a GPU without MIG
            return False
        return bool(current == self._nvml.NVML_DEVICE_MIG_ENABLE)

    def gpus(self) -> list[GpuFacts]:
        n = self._nvml
        out = []
        for i in range(self._call("nvmlDeviceGetCount", n.nvmlDeviceGetCount)):
            h = self._call(f"nvmlDeviceGetHandleByIndex({i})", n.nvmlDeviceGetHandleByIndex, i)
            mem = self._call(f"nvmlDeviceGetMemoryInfo({i})", n.nvmlDeviceGetMemoryInfo, h)
            pci = self._call(f"nvmlDeviceGetPciInfo({i})", n.nvmlDeviceGetPciInfo, h)
            out.append(
                GpuFacts(
                    uuid=_text(self._call(f"nvmlDeviceGetUUID({i})", n.nvmlDeviceGetUUID, h)),
                    index=i,
                    pci_bus_id=_text(pci.busId),
                    memory_total_mib=int(mem.total // MIB),
                    memory_used_mib=mem.used / MIB,
                    mig=self._mig(h),
                    numa_node=-1,
                )
            )
        return out

    def processes(self, gpu: GpuFacts) -> list[Process]:
        n = self._nvml
        h = self._call(f"handle of {gpu.uuid}", n.nvmlDeviceGetHandleByUUID, gpu.uuid)
        procs = self._call(
            f"nvmlDeviceGetComputeRunningProcesses({gpu.index})",
            n.nvmlDeviceGetComputeRunningProcesses,
            h,
        )
        return [
            Process(
                int(p.pid),
                gpu.uuid,
                None if p.usedGpuMemory is None else p.usedGpuMemory / MIB,
            )
            for p in procs
        ]


class FakeNvml:
    """GPUs and processes from a JSON file, re-read on every call so a test can change it:

        {"gpus": [{"uuid": "GPU-...", "index": 0, "pci_bus_id": "00000000:3B:00.0",
                   "memory_total_mib": 81920, "base_used_mib": 300, "mig": false}],
         "processes": [{"pid": 1234, "gpu": "GPU-...", "used_mib": 2048}]}

    Like the driver, a process's memory is held only while it lives: a PID that no longer
    exists (a real process the test started and the agent killed) is not listed, and its
    memory is not counted in `memory_used_mib`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def _doc(self) -> dict[str, Any]:
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError) as e:
            raise NvmlError(f"fake NVML file {self.path}: {e}") from None
        if not isinstance(doc, dict):
            raise NvmlError(f"fake NVML file {self.path}: not a JSON object")
        return doc

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        try:  # a zombie (killed, not yet reaped by its parent) holds no GPU memory
            return not Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].startswith("Z")
        except (OSError, IndexError):
            return False

    def _live(self, doc: dict[str, Any]) -> list[dict[str, Any]]:
        return [p for p in doc.get("processes") or [] if self._alive(int(p["pid"]))]

    def gpus(self) -> list[GpuFacts]:
        doc = self._doc()
        live = self._live(doc)
        return [
            GpuFacts(
                uuid=g["uuid"],
                index=int(g["index"]),
                pci_bus_id=g["pci_bus_id"],
                memory_total_mib=int(g["memory_total_mib"]),
                memory_used_mib=float(g.get("base_used_mib", 0))
                + sum(float(p.get("used_mib") or 0) for p in live if p["gpu"] == g["uuid"]),
                mig=bool(g.get("mig", False)),
                numa_node=-1,
            )
            for g in doc.get("gpus") or []
        ]

    def processes(self, gpu: GpuFacts) -> list[Process]:
        return [
            Process(int(p["pid"]), gpu.uuid, p.get("used_mib"))
            for p in self._live(self._doc())
            if p["gpu"] == gpu.uuid
        ]
