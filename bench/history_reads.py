"""whatif's history reads alone (issue 20): K workloads' D days from a real Prometheus.

Backfills (promtool) K workloads as bench/whatif.py does (request rate every 10 s, the
HPA's replicas every 60 s), then reads their history as whatif does (`HistoryReader`: two
series a workload at the 10 s step, chunked under the point limit), one workload at a time
and READERS at a time, `--rounds` times each. With `--base DIR` (a checkout of another
revision, e.g. a `git worktree` of main) the same reads run with that revision's code in
a child process (PYTHONPATH=DIR) against the same Prometheus, alternated with this one's,
and every history is checked equal to this revision's, value for value (NaN where NaN).
Per read: wall seconds, this process' CPU and Prometheus' CPU (from /proc); the figures
are medians over the rounds, scaled to `--workloads` (100) workloads. Last line:
  RESULT read workloads=N days=D read=K read_s= read_threads_s= cpu_s= prometheus_cpu_s=
  [base_read_s= base_read_threads_s= base_cpu_s= base_prometheus_cpu_s= speedup=
  speedup_threads= same_histories=true]
(`read_s`: all N one at a time; `read_threads_s`: READERS at a time, as whatif reads a
chunk; `cpu_s` and `prometheus_cpu_s` of the one-at-a-time read.) `--profile` prints a
cProfile of one one-at-a-time read of this revision.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

STEP = 10.0


def read_once(config_path: str, since: float, until: float, readers: int) -> tuple[Any, float]:
    """(the histories, wall seconds) of one read of every configured workload."""
    from gpuscaler.adapters.prometheus.history import HistoryReader
    from gpuscaler.config import parse_config

    config = parse_config(Path(config_path).read_text())
    reader = HistoryReader(config)
    t0 = time.perf_counter()
    if readers <= 1:
        got = [reader.workload(w, since - STEP, until + STEP, STEP) for w in config.workloads]
    else:
        got = reader.workloads(config.workloads, since - STEP, until + STEP, STEP, readers)
    return got, time.perf_counter() - t0


def arrays(histories: Any) -> dict[str, np.ndarray]:
    """Every signal's values (and its problem) by workload and signal."""
    out: dict[str, np.ndarray] = {}
    for h in histories:
        for s in (h.requests, h.load, h.replicas):
            key = f"{h.key}|{s.name}"
            out[key + "|problem"] = np.array(str(s.problem))
            if s.series is not None:
                out[key] = s.series.values
                out[key + "|grid"] = np.array([s.series.start, s.series.step])
    return out


def child(args: argparse.Namespace) -> None:
    """One read in this process (the code on PYTHONPATH): its histories to --out, its
    wall and CPU seconds to stdout."""
    import gpuscaler.adapters.prometheus.history
    import gpuscaler.config  # noqa: F401  (imported before the clock starts)

    c0 = time.process_time()
    histories, wall = read_once(args.config, args.since, args.until, args.readers)
    cpu = time.process_time() - c0
    np.savez(args.out, **arrays(histories))  # type: ignore[arg-type]  # (numpy's stub: allow_pickle)
    print(json.dumps({"wall": wall, "cpu": cpu}))


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(
        np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f") for k in a
    )


def one_read(
    args: argparse.Namespace, root: Path, base: str | None, readers: int, pid: int | None
) -> tuple[float, float, float, dict[str, np.ndarray]]:
    """(wall, CPU, Prometheus CPU, the histories) of one read, in a child process."""
    from tickone import process_cpu

    out = root / "read.npz"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if base is not None:
        env["PYTHONPATH"] = base
    cmd = [sys.executable, __file__, "--child", "--out", str(out), "--config", args.config]
    cmd += ["--since", repr(args.since), "--until", repr(args.until), "--readers", str(readers)]
    p0 = process_cpu(pid)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    prom = process_cpu(pid) - p0
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    with np.load(out) as loaded:
        histories = {k: loaded[k] for k in loaded.files}
    return figures["wall"], figures["cpu"], prom, histories


def measure(args: argparse.Namespace, root: Path, url: str) -> None:
    from tickone import prometheus_pid

    from gpuscaler.adapters.prometheus.history import READERS

    pid = prometheus_pid(url)
    sides = [("", None)] + ([("base_", args.base)] if args.base else [])
    runs: dict[str, list[float]] = {}
    reference: dict[str, np.ndarray] | None = None
    equal = True
    for _ in range(args.rounds):
        for prefix, base in sides:
            for readers, name in ((1, "read"), (READERS, "read_threads")):
                wall, cpu, prom, got = one_read(args, root, base, readers, pid)
                runs.setdefault(f"{prefix}{name}_s", []).append(wall)
                if readers == 1:
                    runs.setdefault(f"{prefix}cpu_s", []).append(cpu)
                    runs.setdefault(f"{prefix}prometheus_cpu_s", []).append(prom)
                reference = got if reference is None else reference
                equal = equal and same(reference, got)
                line = f"{prefix}{name}: wall {wall:.2f} cpu {cpu:.2f} prom {prom:.2f}"
                print(line, file=sys.stderr)
    scale = args.workloads / args.read
    fig = {k: statistics.median(v) * scale for k, v in runs.items()}
    text = " ".join(f"{k}={v:.2f}" for k, v in fig.items())
    if args.base:
        text += f" speedup={fig['base_read_s'] / fig['read_s']:.2f}"
        text += f" speedup_threads={fig['base_read_threads_s'] / fig['read_threads_s']:.2f}"
        text += f" same_histories={'true' if equal else 'false'}"
    print(f"RESULT read workloads={args.workloads} days={args.days:g} read={args.read} {text}")
    if not equal:
        raise SystemExit("the two revisions read different histories")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", type=int, default=100, help="scale the figures to N")
    ap.add_argument("--read", type=int, default=8, help="workloads backfilled and read (K)")
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--base", default=None, help="another revision's checkout, read alike")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--since", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--until", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--readers", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    from promserver import prometheus
    from whatif import config_text, write_data

    seconds = args.days * 86400
    points = round(seconds / STEP) + 3
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = math.floor(time.time() / STEP) * STEP - points * STEP - 3600
        write_data(root / "data.om", start, points, args.read)
        args.since, args.until = start + STEP, start + STEP + seconds
        with prometheus(data=root / "data.om", backfill_timeout=1800) as url:
            args.config = str(root / "whatif.yaml")
            Path(args.config).write_text(config_text(url, args.read))
            if args.profile:
                profile = cProfile.Profile()
                profile.runcall(read_once, args.config, args.since, args.until, 1)
                pstats.Stats(profile, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
            measure(args, root, url)


if __name__ == "__main__":
    main()
