"""The per-target window bookkeeping of a steady tick at N GPUs, Python only (issue 18).

`PrometheusMetrics.read` over N/100 pools and N/10 workloads (bench/tick.py's config),
answered by a fake transport from arrays built beforehand (what the grouped answer
hands each target after orjson decoding), so what is timed is the reads' Python: the
per-target read, decode, range check, advance, write and the Series handed to the core
(and the pools' frame-buffer instant reads, two per pool, which keep no window).
A first tick fills the windows; then steady ticks 30 s apart, each reading 61 new points
per target, about 1 % of them NaN (gaps).

The baseline is another revision of gpuscaler (`--base`, default the branch's start),
extracted with `git archive` and run in a child process alternately with the worktree's
code, so load drift hits both. Run it niced: `nice -n 10 .venv/bin/python bench/windows.py`.

Last line: RESULT windows_base_s= windows_s= speedup= (the median over rounds of each
child's fastest steady read, in seconds).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from revision import unpack

ROOT = Path(__file__).resolve().parent.parent
START = 1_800_000_000.0


class FakeTransport:
    """Every range query answered from arrays built once per (start, end)."""

    def __init__(self, seed: int = 1):
        self.rng = np.random.default_rng(seed)
        self.cache: dict[tuple[int, int], list[Any]] = {}

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Any]:
        key = (math.floor(start), math.floor(end))
        if key not in self.cache:
            t = np.arange(key[0], key[1] + 1e-9, step)
            v = 40 + 10 * np.sin(t / 300.0) + self.rng.normal(0, 3, t.size)
            v[self.rng.random(t.size) < 0.01] = np.nan  # a gap now and then
            self.cache[key] = [{"metric": {}, "values": [], "arrays": (t, v)}]
        return self.cache[key]

    def query(self, query: str, time: float | None = None) -> list[Any]:
        return [{"metric": {}, "value": [time, "30000"]}]


def child(gpus: int, ticks: int) -> None:
    """Time `ticks` steady reads in this process; print one line per read."""
    sys.path.insert(0, str(ROOT / "bench"))
    from tick import config

    from gpuscaler.adapters.prometheus.source import PrometheusMetrics

    fake: Any = FakeTransport()  # a Transport as far as the reads go
    metrics = PrometheusMetrics(config("http://fake:1", gpus, False), fake)
    metrics.read(START)
    for k in range(1, ticks + 1):
        begin = time.perf_counter()
        metrics.read(START + 30 * k)
        print(f"{time.perf_counter() - begin:.6f}", flush=True)


def run(pythonpath: str, gpus: int, ticks: int) -> float:
    """Fastest steady read of the code at `pythonpath`, in a child process (the least
    disturbed by other jobs on the shared cores: the reads all do the same work)."""
    env = {**os.environ, "PYTHONPATH": pythonpath}
    cmd = [sys.executable, __file__, "--child", "--gpus", str(gpus), "--ticks", str(ticks)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    times = [float(line) for line in out.split()]
    return min(times[1:])  # the first steady read still warms caches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--ticks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base", default="3aaf376", help="baseline git revision")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.gpus, args.ticks)
        return
    with tempfile.TemporaryDirectory() as tmp:
        unpack(args.base, tmp)
        base, branch = [], []
        for r in range(args.rounds):
            base.append(run(tmp, args.gpus, args.ticks))
            branch.append(run(str(ROOT), args.gpus, args.ticks))
            print(f"round {r}: base {base[-1]:.3f} s, branch {branch[-1]:.3f} s", flush=True)
    b, n = statistics.median(base), statistics.median(branch)
    print(f"load average {os.getloadavg()[0]:.1f}; {args.gpus} GPUs, steady reads")
    print(f"RESULT windows_base_s={b:.4f} windows_s={n:.4f} speedup={b / n:.2f}")


if __name__ == "__main__":
    main()
