"""The replays' malloc thresholds (gpuscaler/allocator.py, issue 20), checked by what the
kernel counts: minor page faults of a process that frees a large array and makes another."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import gpuscaler.commands.offline as offline
from gpuscaler import cli

REFAULT = """
import json, resource, sys
import numpy as np
from gpuscaler.allocator import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
a = np.ones(8 << 20)  # 64 MB: above glibc's largest mmap threshold of its own (32 MB)
del a
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
b = np.ones(8 << 20)
print(json.dumps({"kept": kept, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""
HUGE_PAGES = (64 << 20) // (2 << 20)
"""The fewest faults a fresh 64 MB mapping takes: one a 2 MB page (transparent huge pages
on), one a 4 KB page (16,384) without them."""


def refault(mode: str) -> dict[str, object]:
    """The minor faults of making a 64 MB array again after freeing one, in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-c", REFAULT, mode],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    found: dict[str, object] = json.loads(out.stdout)
    return found


def test_with_the_thresholds_raised_a_freed_array_s_pages_are_used_again_not_mapped_afresh() -> (
    None
):
    kept, plain = refault("keep"), refault("plain")
    assert kept["kept"] is True  # glibc here (Debian)
    assert isinstance(kept["faults"], int) and isinstance(plain["faults"], int)
    assert plain["faults"] >= HUGE_PAGES  # without: every page of the new mapping faulted in
    assert kept["faults"] < HUGE_PAGES // 4  # with: the freed heap pages, already there


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["simulate", "--hours", "0.05", "--no-baselines", "--json"], "cmd_simulate"),
        (["whatif", "--config", "/nonexistent/config.yaml", "--since", "1d"], "cmd_whatif"),
        (["backtest", "--series", "/nonexistent/series.csv"], "cmd_backtest"),
    ],
)
def test_the_offline_replays_raise_the_thresholds_before_they_run(
    argv: list[str], command: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[str] = []

    def keep() -> bool:
        calls.append(command)
        return True

    monkeypatch.setattr(offline, "keep_freed_memory", keep)
    monkeypatch.chdir(tmp_path)
    with contextlib.suppress(SystemExit):  # a missing config or series exits 2 after it
        cli.main(argv)
    assert calls == [command]
