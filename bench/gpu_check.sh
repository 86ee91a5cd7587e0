#!/usr/bin/env bash
# The node agent's real GPU paths, on a machine with an NVIDIA GPU (run as root, or with
# CAP_SYS_ADMIN, for the time slice): list the GPUs through NVML (nvidia-ml-py), read the
# topology the agent publishes (NUMA node from /sys), list compute processes, then set the
# time slice of the first non-MIG GPU to `short` with nvidia-smi and restore `default`
# (nvidia-smi has no query for the current level, so `default` is what is restored).
#
#   bench/gpu_check.sh            last line: RESULT gpu=present gpus=N ... set_ok=1 restore_ok=1
#
# Without a GPU it says so and prints `RESULT gpu=absent ...` with exit 0, so the test suite
# (tests/adapters/test_agent_adapters.py) runs it everywhere. Exit 1 when a real call failed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
exec "$PYTHON" - "$@" <<'PY'
import sys
import time

from gpuscaler.adapters.host import HostFs
from gpuscaler.adapters.nvidia_smi import set_timeslice
from gpuscaler.adapters.nvml import NvmlError, RealNvml
from gpuscaler.core.node_agent import GpuFacts, topology_annotation

try:
    nvml = RealNvml()
except NvmlError as e:
    print(f"no GPU here: {e}", file=sys.stderr)
    print("RESULT gpu=absent gpus=0 nvml=unavailable")
    sys.exit(0)
started = time.perf_counter()
gpus = nvml.gpus()
list_ms = (time.perf_counter() - started) * 1000
host = HostFs()
facts = [
    GpuFacts(g.uuid, g.index, g.pci_bus_id, g.memory_total_mib, g.memory_used_mib, g.mig,
             host.numa_node(g.pci_bus_id))
    for g in gpus
]
print("gpu-topology:", topology_annotation(facts))
processes = 0
for g in gpus:
    procs = nvml.processes(g)
    processes += len(procs)
    for p in procs:
        cgroup = (host.cgroup(p.pid) or "").strip().splitlines()[:1]
        print(f"GPU {g.index}: pid {p.pid} {p.used_mib} MiB cgroup {cgroup}")
target = next((g for g in gpus if not g.mig), None)
set_ok = restore_ok = "skipped"
if target is not None:
    first = set_timeslice("nvidia-smi", target.uuid, 1, 30)
    print(f"set short on GPU {target.index}: ok={first.ok} {first.detail}")
    again = set_timeslice("nvidia-smi", target.uuid, 0, 30)
    print(f"restore default on GPU {target.index}: ok={again.ok} {again.detail}")
    set_ok, restore_ok = str(int(first.ok)), str(int(again.ok))
print(
    f"RESULT gpu=present gpus={len(gpus)} mig={sum(g.mig for g in gpus)} "
    f"numa_known={sum(f.numa_node >= 0 for f in facts)} processes={processes} "
    f"list_ms={list_ms:.1f} set_ok={set_ok} restore_ok={restore_ok}"
)
sys.exit(1 if "0" in (set_ok, restore_ok) else 0)
PY
