"""What-if speed: `gpuscaler whatif` replaying N workload-weeks from a real Prometheus.

Backfills (promtool) N workloads' request rate (10 s samples: the bundled Azure LLM
conversation week, rotated and scaled per workload) and their HPA's replica counts
(kube-state-metrics' `kube_horizontalpodautoscaler_status_current_replicas`, 60 s), then
runs `gpuscaler whatif --jobs J` in a child process on the first `--replay K` workloads
(default J of them; `--replay 100` is the whole gate), measuring its wall time, its CPU
time (all its processes) and its memory (the largest process' peak RSS, and every
process' RSS together sampled every 0.2 s).

Baselines, each measured in the same run on the same backfill, alternated `--rounds` times
(every other round in reverse order):
- `gpuscaler simulate` of workload 0's trace from a CSV at the same slot for
  `--baseline-hours` (the same model without Prometheus): `ratio` is whatif's CPU a
  workload-day over simulate's CPU a day;
- `--speedup`: the same whatif with `--jobs 1`: `speedup_2_jobs` is its wall time over the
  `--jobs 2` run's (parallel speed-up is a wall-time figure);
- `--base REV`: another revision's whatif (`git archive`, run on PYTHONPATH):
  `vs_base` is this tree's wall time over the base's (the gate), `vs_base_cpu` the
  same of CPU time (all processes).

Gate (on the whole run, `--replay` equal to `--workloads`): at most 1.25x the base's time
(goal: 300 s for 100 workload-weeks on 2 cores), at most 1 GB of all processes together,
and at least 1.7x faster with 2 worker processes than with 1. A replay of K < N workloads
estimates N's time as K's x N/K (the replay of a workload does not depend on the others)
and says so: `gate=...(estimated)`; a gate whose baselines were not run says which
(`gate=pass(untested:vs_base)`).

    python bench/whatif.py --replay 100 --speedup --base <today's main>   # the gate, ~1 h
    python bench/whatif.py --workloads 2 --days 1 --speedup               # a quick check

Last line: RESULT workloads= days= replayed= seconds= (or seconds_estimated=) cpu_s=
rss_mb= rss_total_mb= simulate_cpu_s= ratio= [speedup_2_jobs=] [vs_base= vs_base_cpu=] gate=
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from harness import ROOT, env_for, unpack
from promserver import binaries, prometheus

from gpuscaler.sim.trace import load_trace

STEP = 10.0
REPLICA_STEP = 60.0
SCRIPT = Path(sys.executable).parent / "gpuscaler"
GATE_VS_BASE, GATE_MB, GATE_SPEEDUP = 1.25, 1024.0, 1.7


def config_text(url: str, workloads: int, slot: str = "500ms") -> str:
    lines = [
        "prometheus:",
        f'  url: "{url}"',
        "  timeout: 60s",
        "  queries:",
        '    workload_requests: "sum(last_over_time(app_requests_per_second'
        '{{{matchers}}}[{lookback}]))"',
        f"simulator: {{preemption_burst_after: null, slot: {slot}}}",
        "node_pools:",
        "  - {name: a100-80gb, selector: {label: nvidia.com/gpu.product, value: A100},",
        "     gpu_memory_gib: 80, workload_type: inference, profile: compute_bound,",
        "     initial_fragments: 2}",
        "workloads:",
    ]
    for i in range(workloads):
        lines.append(
            f"  - {{namespace: bench, kind: ScaledObject, name: w{i:03d}, node_pool: a100-80gb,"
            " overrides: {replicas: {max_replicas: 200}}}"
        )
    return "\n".join(lines) + "\n"


def demand(i: int, base: np.ndarray, points: int) -> np.ndarray:
    """Workload i's requests per second: the trace rotated by i/N of it, scaled."""
    shift = (i * 6047) % len(base)
    rate = np.roll(base, -shift)[:points]
    return np.asarray(rate * (0.5 + (i % 10) / 10), dtype=np.float64)


def backfill_base(points: int) -> np.ndarray:
    """The bundled trace's requests per second, repeated to at least `points`."""
    base = np.nan_to_num(load_trace().counts / STEP)
    return np.resize(base, points) if points > len(base) else base


def kept_blocks(
    keep: Path | None, workloads: int, days: float, start: float
) -> tuple[Path | None, float]:
    """The TSDB blocks kept in `keep` by an earlier run with the same workloads and days,
    and the start of their range; else (None, `start`)."""
    if keep is None or not (stamp := keep / "stamp.json").exists():
        return None, start
    kept = json.loads(stamp.read_text())
    if (kept["workloads"], kept["days"]) != (workloads, days):
        return None, start
    print(f"reusing the blocks in {keep} (backfilled from {kept['start']:.0f})", file=sys.stderr)
    return keep / "blocks", float(kept["start"])


def backfill(data: Path, keep: Path, workloads: int, days: float, start: float) -> Path:
    """promtool's blocks of `data`, made in `keep` (stamped for `kept_blocks`)."""
    blocks = keep / "blocks"
    shutil.rmtree(blocks, ignore_errors=True)
    blocks.mkdir(parents=True)
    tool = binaries()[1]
    cmd = [tool, "tsdb", "create-blocks-from", "openmetrics", str(data), str(blocks)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=1800)
    stamp = {"workloads": workloads, "days": days, "start": start}
    (keep / "stamp.json").write_text(json.dumps(stamp))
    return blocks


def write_data(path: Path, start: float, points: int, workloads: int) -> None:
    base = backfill_base(points)
    times = start + STEP * np.arange(points)
    every = round(REPLICA_STEP / STEP)
    with path.open("w", encoding="utf-8") as out:
        out.write("# TYPE app_requests_per_second gauge\n")
        for i in range(workloads):
            labels = f'namespace="bench",pod="w{i:03d}-0"'
            rate = demand(i, base, points)
            out.writelines(
                f"app_requests_per_second{{{labels}}} {v:.6g} {t:.0f}\n"
                for t, v in zip(times, rate, strict=True)
            )
        name = "kube_horizontalpodautoscaler_status_current_replicas"
        out.write(f"# TYPE {name} gauge\n")
        for i in range(workloads):
            labels = f'horizontalpodautoscaler="keda-hpa-w{i:03d}",namespace="bench"'
            reps = np.maximum(1, np.ceil(demand(i, base, points) * 0.06 * 100 / 35))
            out.writelines(
                f"{name}{{{labels}}} {v:.0f} {t:.0f}\n"
                for t, v in zip(times[::every], reps[::every], strict=True)
            )
        out.write("# EOF\n")


MEASURED = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "sys.stdout.write(done.stdout)\n"
    "sys.stderr.write(done.stderr)\n"
    "usage = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "cpu = usage.ru_utime + usage.ru_stime\n"
    "sys.stderr.write(f'\\npeak_rss_kb={usage.ru_maxrss} cpu_s={cpu}\\n')\n"
    "sys.exit(done.returncode)\n"
)
"""Runs a command in a fresh process and reports the command's own peak RSS (its largest
process') and CPU time (its worker processes' included), not promtool's or Prometheus',
which are children of the benchmark."""


def tree_rss_mb(root: int) -> float:
    """RSS now of `root`'s descendants (not `root` itself), in MB, from /proc (Linux)."""
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    total, todo = 0, list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        todo += kids.get(pid, [])
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        total += sum(int(x.split()[1]) for x in status.splitlines() if x.startswith("VmRSS:"))
    return total / 1024


def measured(cmd: list[str], env: dict[str, str]) -> tuple[str, dict[str, float]]:
    """`cmd`'s standard output and {wall, cpu: seconds; rss: its largest process' peak RSS,
    rss_total: all its processes' RSS together, sampled every 0.2 s, in MB}."""
    began = time.perf_counter()
    with subprocess.Popen(
        [sys.executable, "-c", MEASURED, *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as proc:
        peak_total = [0.0]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.2):
                peak_total[0] = max(peak_total[0], tree_rss_mb(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        out, err = proc.communicate()
        stop.set()
        sampler.join()
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[1]} failed ({proc.returncode}): {err[-2000:]}")
    tail = dict(f.split("=") for f in err.rsplit("\n", 2)[-2].split())
    figures = {"wall": wall, "cpu": float(tail["cpu_s"]), "rss": float(tail["peak_rss_kb"]) / 1024}
    return out, {**figures, "rss_total": peak_total[0]}


def planted(root: Path, args: argparse.Namespace, replay: int) -> tuple[Path | None, float]:
    """(the OpenMetrics file or None when kept blocks are reused, the planted range's
    start); workload 0's trace written to root/w000.csv for simulate."""
    points = round(args.days * 86400 / STEP) + 3  # one step of margin each side, as read
    start = math.floor(time.time() / STEP) * STEP - points * STEP - 3600
    blocks, start = kept_blocks(args.keep_blocks, replay, args.days, start)
    rate0 = demand(0, backfill_base(points), points)
    (root / "w000.csv").write_text(
        "time,requests\n"
        + "".join(f"{start + k * STEP:.0f},{r * STEP:.6g}\n" for k, r in enumerate(rate0))
    )
    if blocks is not None:
        return None, start
    began = time.perf_counter()
    write_data(root / "data.om", start, points, replay)
    took = time.perf_counter() - began
    print(f"wrote {replay} workloads x {points} points in {took:.0f} s", file=sys.stderr)
    return root / "data.om", start


def whatif_cmd(config: Path, since: float, until: float, jobs: int, only: int) -> list[str]:
    cmd = [str(SCRIPT), "whatif", "--config", str(config), "--since", f"{since:.0f}"]
    cmd += ["--until", f"{until:.0f}", "--json", "--jobs", str(jobs)]
    for i in range(only):
        cmd += ["--workload", f"bench/w{i:03d}"]
    return cmd


def runs(
    args: argparse.Namespace, root: Path, base: Path | None, replay: int
) -> dict[str, list[dict[str, float]]]:
    """Each variant's measured runs, alternated `args.rounds` times on one backfill."""
    data, start = planted(root, args, replay)
    since, until = start + STEP, start + STEP + args.days * 86400
    blocks = None
    if data is not None and args.keep_blocks is not None:
        blocks = backfill(data, args.keep_blocks, replay, args.days, start)
        data = None
    elif data is None:
        blocks = args.keep_blocks / "blocks"
    hours = min(args.baseline_hours, args.days * 24)
    out: dict[str, list[dict[str, float]]] = {}
    with prometheus(data=data, blocks=blocks, backfill_timeout=1800) as url:
        (root / "whatif.yaml").write_text(config_text(url, args.workloads))
        (root / "simulate.yaml").write_text(config_text(url, 1, slot=f"{STEP:g}s"))
        only = replay if replay < args.workloads else 0
        variants: dict[str, tuple[list[str], Path]] = {
            "whatif": (whatif_cmd(root / "whatif.yaml", since, until, args.jobs, only), ROOT)
        }
        if args.speedup:
            variants["jobs_1"] = (whatif_cmd(root / "whatif.yaml", since, until, 1, only), ROOT)
        if base is not None:
            variants["base"] = (variants["whatif"][0], base)
        simulate = [str(SCRIPT), "simulate", "--trace", str(root / "w000.csv"), "--json"]
        simulate += ["--config", str(root / "simulate.yaml"), "--start", repr(STEP / 3600)]
        variants["simulate"] = ([*simulate, "--hours", repr(hours)], ROOT)
        for r in range(args.rounds):  # every other round in reverse: none always goes first
            for name, (cmd, tree) in list(variants.items())[:: -1 if r % 2 else 1]:
                stdout, figures = measured(cmd, env_for(tree))
                if name != "simulate":
                    done = json.loads(stdout)
                    assert len(done["workloads"]) == replay, done["skipped"]
                out.setdefault(name, []).append(figures)
                print(f"round {r} {name}: {json.dumps(figures)}", file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", type=int, default=100)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--jobs", type=int, default=2, help="whatif --jobs (processes)")
    ap.add_argument("--replay", type=int, help="replay only the first K (default: --jobs)")
    ap.add_argument("--baseline-hours", type=float, default=6.0, help="simulate's replay")
    ap.add_argument("--speedup", action="store_true", help="also whatif --jobs 1 (with --jobs 2)")
    ap.add_argument("--base", default="", help="also this revision's whatif")
    ap.add_argument("--rounds", type=int, default=1, help="alternated runs of each")
    ap.add_argument(
        "--keep-blocks",
        type=Path,
        help="keep the backfilled TSDB blocks in DIR and reuse them when DIR holds the same "
        "workloads and days (skips promtool's minutes)",
    )
    args = ap.parse_args()
    replay = min(args.jobs if args.replay is None else args.replay, args.workloads)
    with tempfile.TemporaryDirectory() as tmp:
        base = None
        if args.base:
            base = Path(tmp) / "base"
            base.mkdir()
            unpack(args.base, base)
        rows = runs(args, Path(tmp), base, replay)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[name]) if name in rows else math.nan

    wall, hours = median("whatif", "wall"), min(args.baseline_hours, args.days * 24)
    ratio = (median("whatif", "cpu") / replay / args.days) / (
        median("simulate", "cpu") / hours * 24
    )
    full = replay == args.workloads
    fields = [
        f"workloads={args.workloads} days={args.days:g} replayed={replay} jobs={args.jobs}",
        f"seconds={wall:.1f}"
        if full
        else f"seconds_estimated={wall * args.workloads / replay:.0f}",
        f"cpu_s={median('whatif', 'cpu'):.1f} rss_mb={median('whatif', 'rss'):.0f}",
        f"rss_total_mb={median('whatif', 'rss_total'):.0f}",
        f"simulate_cpu_s={median('simulate', 'cpu'):.1f} ratio={ratio:.2f}",
    ]
    ok, untested = median("whatif", "rss_total") <= GATE_MB, []
    if args.speedup and args.jobs == 2:
        speedup = median("jobs_1", "wall") / wall
        fields.append(f"speedup_2_jobs={speedup:.2f}")
        ok = ok and speedup >= GATE_SPEEDUP
    else:
        untested.append("speedup_2_jobs")
    if base is not None:
        fields.append(f"vs_base={wall / median('base', 'wall'):.2f}")
        fields.append(f"vs_base_cpu={median('whatif', 'cpu') / median('base', 'cpu'):.2f}")
        ok = ok and wall / median("base", "wall") <= GATE_VS_BASE
    else:
        untested.append("vs_base")
    gate = "pass" if ok else "fail"
    notes = ([] if full else ["estimated"]) + [f"untested:{','.join(untested)}"] * bool(untested)
    print(
        "RESULT " + " ".join(fields) + f" gate={gate}" + (f"({';'.join(notes)})" if notes else "")
    )


if __name__ == "__main__":
    main()
