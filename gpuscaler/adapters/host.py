"""Host adapter: what the node agent reads from /proc and /sys, and the signals it sends.

Every path starts at a root given to the constructor (`/proc` and `/sys` on a node, a
temporary tree in tests). The DaemonSet runs with `hostPID: true`, so /proc shows every
process of the node.

Signals go through a pidfd (Linux 5.3+): the process is opened, its start time is checked
against the one it had when judged an orphan, and only then signalled, so a PID the kernel
reused in between is never hit. Without pidfd_open (ENOSYS) the start time is checked just
before kill(2).
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuscaler.adapters.nvml import sysfs_bus_id


@dataclass(frozen=True)
class HostFs:
    proc_root: Path = Path("/proc")
    sys_root: Path = Path("/sys")

    def _read(self, path: Path) -> str | None:
        try:
            return path.read_text(errors="replace")
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            return None

    def cgroup(self, pid: int) -> str | None:
        """The text of /proc/<pid>/cgroup; None when the process is gone."""
        return self._read(self.proc_root / str(pid) / "cgroup")

    def start_time(self, pid: int) -> int | None:
        """Field 22 of /proc/<pid>/stat (clock ticks after boot); None when gone or
        unreadable. The command name (field 2) may hold spaces and parentheses, so the
        fields are counted after its last ')'."""
        text = self._read(self.proc_root / str(pid) / "stat")
        if text is None or ")" not in text:
            return None
        fields = text.rsplit(")", 1)[1].split()
        try:
            return int(fields[19])  # fields[0] is field 3 (state)
        except (IndexError, ValueError):
            return None

    def name(self, pid: int) -> str:
        text = self._read(self.proc_root / str(pid) / "comm")
        return text.strip() if text else "?"

    def numa_node(self, nvml_bus_id: str) -> int:
        """/sys/bus/pci/devices/<bdf>/numa_node; -1 when unknown (no such file, not a
        number, or the kernel's own -1 on a machine without NUMA)."""
        try:
            bdf = sysfs_bus_id(nvml_bus_id)
        except ValueError:
            return -1
        text = self._read(self.sys_root / "bus" / "pci" / "devices" / bdf / "numa_node")
        try:
            return int(text.strip()) if text is not None else -1
        except ValueError:
            return -1

    def signal(self, pid: int, start: int, sig: signal.Signals) -> str:
        """Send `sig` to `pid` if it is still the process started at `start`. Returns
        "sent", "gone" (exited already) or "reused" (another process has the PID now);
        raises OSError when not permitted (no CAP_KILL)."""
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return "gone"
        except OSError as e:
            if e.errno != errno.ENOSYS:
                raise
            # No pidfd (a kernel before 5.3, or a seccomp filter): the start time is checked
            # just before kill(2). The kernel hands PIDs out in rising order, so a reuse in
            # between would need the whole PID space to wrap in microseconds.
            return self._checked(pid, start, lambda: os.kill(pid, sig))
        try:
            return self._checked(pid, start, lambda: signal.pidfd_send_signal(fd, sig))
        finally:
            os.close(fd)

    def _checked(self, pid: int, start: int, send: Callable[[], None]) -> str:
        now = self.start_time(pid)
        if now is None:
            return "gone"
        if now != start:
            return "reused"
        try:
            send()
        except ProcessLookupError:
            return "gone"
        return "sent"
