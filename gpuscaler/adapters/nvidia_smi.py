"""nvidia-smi adapter: set a GPU's time slice. NVML has no call for it, so shell out:

    nvidia-smi compute-policy -i <uuid> --set-timeslice <0-3>

(levels default, short, medium, long; NVIDIA publishes no durations). It needs an
administrator caller: the driver's privilege check is `capable(CAP_SYS_ADMIN)`
(NVIDIA/open-gpu-kernel-modules `kernel-open/common/inc/nv-linux.h`, NV_IS_SUSER, used by
`os_is_administrator` in `kernel-open/nvidia/os-interface.c`). MIG devices refuse it; the
core skips them before this is called.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class SmiResult:
    ok: bool
    detail: str


def set_timeslice(binary: str, uuid: str, level: int, timeout: float) -> SmiResult:
    """Run nvidia-smi; ok when it exits 0. Never raises: a missing binary, a timeout or a
    non-zero exit is a result with its reason."""
    if not 0 <= level <= 3:
        return SmiResult(False, f"level {level} is not 0-3")
    path = shutil.which(binary)
    if path is None:
        return SmiResult(False, f"{binary} not found on PATH")
    command = [path, "compute-policy", "-i", uuid, "--set-timeslice", str(level)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return SmiResult(False, f"nvidia-smi timed out after {timeout:g}s")
    except OSError as e:
        return SmiResult(False, f"nvidia-smi could not run: {e}")
    said = (done.stdout + done.stderr).strip().replace("\n", " ")[:300]
    if done.returncode != 0:
        return SmiResult(False, f"nvidia-smi exit {done.returncode}: {said}")
    return SmiResult(True, said)
