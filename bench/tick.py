"""One controller's tick at 10,000 GPUs against a real Prometheus, at the default window.

For N GPUs (`--gpus`, 10,000): N/100 node pools (by `modelName`) and N/10 workloads of
10 GPUs. Prometheus (backfilled by promtool) holds what the default controller reads:
the series the shipped recording rules record (each workload's
`gpuscaler:workload_gpu_utilization:sum`, each pool's `gpuscaler:pool_gpu_utilization:avg`
and `gpuscaler:pool_gpu_stall:avg`) at 500 ms over the default config's whole
`metrics.window` (1 h) before the first tick and through the last, and each GPU's
frame-buffer used and free over the ticks.

Each controller runs in a fresh child process (this file with `--child`), so its peak
RSS (VmHWM) is that controller's alone: its first tick (the window full in Prometheus;
the older part of it is read behind the tick, and `backfill` is the time until the whole
window is held), then `--cycles` steady ticks 30 s apart, each reading what is new. A
steady tick is timed in wall seconds (what the gate bounds) and in CPU seconds of the
controller and of Prometheus (`process_cpu_seconds_total`).

The baseline is another revision's gpuscaler (`--base`, default `main`; '' for none),
unpacked with `git archive` and run as the same child against the same Prometheus,
alternated with this tree's `--rounds` times (every other round the base first):
`tick_cpu_vs_base` is this tree's steady tick CPU (controller and Prometheus) over the
base's, `rss_vs_base` the same for peak RSS (medians over the rounds).

Gates at 10,000 GPUs: peak RSS <= 400 MB (goal 300), steady tick <= 1 s (goal 0.5), first
tick <= 15 s.

    python bench/tick.py                 # 10,000 GPUs (promtool's backfill takes minutes)
    python bench/tick.py --gpus 1000     # the quick check

Last line: RESULT gpus= window_s= rss_<n>_mb= tick_<n>_s= first_tick_<n>_s=
backfill_<n>_s= tick_cpu_<n>_s= prometheus_cpu_<n>_s= tick_cpu_vs_base_<n>=
rss_vs_base_<n>= gate=pass|fail (n/a below 10,000 GPUs)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from harness import (
    HASH,
    ROOT,
    cluster_config,
    controller,
    env_for,
    prometheus_cpu,
    rss_mb,
    unpack,
    wait_backfill,
    window_seconds,
)
from promserver import STEP, prometheus

CYCLE = 30.0
RSS_MB, TICK_S, FIRST_S = 400.0, 1.0, 15.0
POOL_RULES = ("gpuscaler:pool_gpu_utilization:avg", "gpuscaler:pool_gpu_stall:avg")
WORKLOAD_RULE = "gpuscaler:workload_gpu_utilization:sum"


def _lines(head: str, values: np.ndarray, times: list[str]) -> str:
    return "".join(f"{head}{v!r}{t}" for v, t in zip(values.tolist(), times, strict=True))


def write_data(path: Path, gpus: int, start: float, points: int, memory_from: int) -> None:
    """The recorded series over `points` samples from `start`, and each GPU's frame-buffer
    series from sample `memory_from` on (read as instant values at the ticks only)."""
    rng = np.random.default_rng(gpus)
    times = [f" {start + i * STEP:.1f}\n" for i in range(points)]
    t = np.arange(points)
    pools, workloads = gpus // 100, gpus // 10

    def wave(rows: int, low: float, high: float) -> np.ndarray:
        level = rng.uniform(low, high, (rows, 1)) + 10 * np.sin(
            t / rng.uniform(200, 900, (rows, 1))
        )
        values: np.ndarray = np.clip(level + rng.normal(0, 4, (rows, points)), 0, None)
        return values.round(1)

    with path.open("w", encoding="utf-8") as out:
        out.write(f"# TYPE {WORKLOAD_RULE} gauge\n")
        for w, row in enumerate(wave(workloads, 200, 800)):
            out.write(_lines(f'{WORKLOAD_RULE}{{namespace="w{w}",workload="w{w}"}} ', row, times))
        for name, (low, high) in zip(POOL_RULES, ((20, 80), (4, 16)), strict=True):
            out.write(f"# TYPE {name} gauge\n")
            for p, row in enumerate(wave(pools, low, high)):
                out.write(_lines(f'{name}{{modelName="pool-{p}"}} ', row, times))
        tail = times[memory_from:]
        for name, value in (("DCGM_FI_DEV_FB_USED", 30_000.0), ("DCGM_FI_DEV_FB_FREE", 50_000.0)):
            out.write(f"# TYPE {name} gauge\n")
            flat = np.full(len(tail), value)
            for g in range(gpus):
                w = g // 10
                head = (
                    f'{name}{{Hostname="n{g // 8}",UUID="G{g}",modelName="pool-{g % pools}",'
                    f'namespace="w{w}",pod="w{w}-{HASH}-b{g % 10}x2z"}} '
                )
                out.write(_lines(head, flat, tail))
        out.write("# EOF\n")


def child(url: str, gpus: int, first_now: float, cycles: int) -> dict[str, Any]:
    """One controller in this process: its first tick, the backfill of the rest of its
    window, `cycles` steady ticks; wall and CPU seconds, and the peak RSS at the end."""
    tick, source = controller(cluster_config(url, gpus // 100, gpus // 10))
    began, cpu = time.perf_counter(), time.process_time()
    tick.tick(first_now)
    first, first_cpu = time.perf_counter() - began, time.process_time() - cpu
    rss_first = rss_mb()
    wait_backfill(source)
    backfill = time.perf_counter() - began
    rss_backfill = rss_mb()
    rows = []
    for c in range(1, cycles + 1):
        prom = prometheus_cpu(url)
        began, cpu = time.perf_counter(), time.process_time()
        result = tick.tick(first_now + c * CYCLE)
        wall, cpu = time.perf_counter() - began, time.process_time() - cpu
        rows.append((wall, cpu, prometheus_cpu(url) - prom))
    forecast = sum(w.load.forecast is not None for w in result.snapshot.workloads)
    if not source.health.ok or forecast < 0.9 * (gpus // 10):
        raise SystemExit(
            f"the controller read too little: health {source.health}, {forecast} forecasts"
        )
    return {
        "first": first,
        "first_cpu": first_cpu,
        "backfill": backfill,
        "tick": statistics.median(r[0] for r in rows),
        "cpu": statistics.median(r[1] for r in rows),
        "prometheus_cpu": statistics.median(r[2] for r in rows),
        "rss": rss_mb(),
        "rss_after_first": rss_first,
        "rss_after_backfill": rss_backfill,
        "rss_at_end": rss_mb("VmRSS"),
    }


def run_child(tree: Path, url: str, gpus: int, first_now: float, cycles: int) -> dict[str, Any]:
    """`child` in a fresh process importing `tree`'s gpuscaler."""
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            f"--child={url}",
            f"--gpus={gpus}",
            f"--cycles={cycles}",
            f"--first-now={first_now!r}",
        ],
        env=env_for(tree),
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        raise SystemExit(f"the child failed ({done.returncode}): {done.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return row


def warm(url: str, window: float, now: float) -> None:
    """Reads every planted series once, so no child pays for a cold Prometheus (page cache,
    chunk mmaps)."""
    for name in (WORKLOAD_RULE, *POOL_RULES, "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"):
        expr = f"count(count_over_time({name}[{window:.0f}s]))"
        query = urllib.parse.urlencode({"query": expr, "time": f"{now:.3f}"})
        with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=600) as answer:
            answer.read()


def measure(gpus: int, cycles: int, rounds: int, base: Path | None) -> dict[str, float]:
    """This tree's controller (and the base's, alternated) against one planted Prometheus."""
    window = window_seconds()
    end = math.floor(time.time()) - 10
    extra = int(cycles * CYCLE / STEP)
    points = int((window + 60) / STEP) + extra
    start = end - (points - 1) * STEP
    first_now = end - extra * STEP
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "gpus.om"
        began = time.perf_counter()
        write_data(data, gpus, start, points, memory_from=points - extra - int(60 / STEP))
        print(
            f"[{gpus}] planted {data.stat().st_size / 1e6:.0f} MB of samples "
            f"({window:.0f} s window) in {time.perf_counter() - began:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        began = time.perf_counter()
        with prometheus(data, backfill_timeout=3600) as url:
            data.unlink()
            warm(url, window + 60, end)
            print(
                f"[{gpus}] backfilled and started Prometheus in "
                f"{time.perf_counter() - began:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            rows: dict[str, list[dict[str, Any]]] = {"tree": [], "base": []}
            for r in range(rounds):  # every other round the base first
                for which, tree in (("tree", ROOT), ("base", base))[:: -1 if r % 2 else 1]:
                    if tree is None:
                        continue
                    row = run_child(tree, url, gpus, first_now, cycles)
                    rows[which].append(row)
                    print(f"[{gpus}] round {r} {which}: {json.dumps(row)}", file=sys.stderr)
    size = f"{gpus // 1000}k" if gpus >= 1000 else str(gpus)

    def median(which: str, key: str) -> float:
        return statistics.median(row[key] for row in rows[which]) if rows[which] else math.nan

    for key, name in (("rss", "rss_{}_mb"), ("tick", "tick_{}_s"), ("first", "first_tick_{}_s"),
                      ("backfill", "backfill_{}_s"), ("cpu", "tick_cpu_{}_s"),
                      ("prometheus_cpu", "prometheus_cpu_{}_s")):  # fmt: skip
        out[name.format(size)] = median("tree", key)
    tree_cpu = median("tree", "cpu") + median("tree", "prometheus_cpu")
    base_cpu = median("base", "cpu") + median("base", "prometheus_cpu")
    out[f"tick_cpu_vs_base_{size}"] = tree_cpu / base_cpu
    out[f"rss_vs_base_{size}"] = median("tree", "rss") / median("base", "rss")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=10000, help="GPUs (a multiple of 100)")
    parser.add_argument("--cycles", type=int, default=5, help="steady ticks")
    parser.add_argument("--rounds", type=int, default=1, help="children of each tree")
    parser.add_argument("--base", default="main", help="baseline revision ('' for none)")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--first-now", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.gpus < 100 or args.gpus % 100:
        parser.error(f"--gpus {args.gpus}: a multiple of 100 (a pool is 100 GPUs)")
    if args.child:
        print(json.dumps(child(args.child, args.gpus, args.first_now, args.cycles)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) if args.base else None
        if base is not None:
            unpack(args.base, base)
        out = measure(args.gpus, args.cycles, args.rounds, base)
    if args.gpus == 10000:
        ok = out["rss_10k_mb"] <= RSS_MB and out["tick_10k_s"] <= TICK_S
        gate = "pass" if ok and out["first_tick_10k_s"] <= FIRST_S else "fail"
    else:
        gate = "n/a"
    fields = " ".join(
        f"{k}={v:.0f}" if k.endswith("mb") else f"{k}={v:.3f}" for k, v in out.items()
    )
    print(f"RESULT gpus={args.gpus} window_s={window_seconds():.0f} {fields} gate={gate}")


if __name__ == "__main__":
    main()
