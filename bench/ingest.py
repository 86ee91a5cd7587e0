"""Ingestion: a steady tick reads only what is new, against refetching the whole window.

Prometheus (backfilled by promtool) holds 1,000 GPUs' utilization at 500 ms over the
default config's window (1 h) and the ticks after it: 10 node pools (by `modelName`) and
100 workloads of 10 GPUs (namespace/pod), raw series only (no recording rules). A
controller with the default config reads its first window, then ticks every 30 s
(`--cycles`), reading what is new; alternately with each of those ticks, a fresh
controller reads the whole window at the same time in one tick (`background_backfill:
false`), the cost every tick would have without incremental reads. Both are timed in CPU
seconds, the controller's (`time.process_time`, all its threads) plus Prometheus'
(`process_cpu_seconds_total`); `ratio` is the refetching tick's over the steady one's
(medians).

    python bench/ingest.py [--cycles 5]

Last line: RESULT window_s= steady_cpu_s= refetch_cpu_s= ratio= steady_tick_s= (wall)
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from harness import cluster_config, controller, prometheus_cpu, wait_backfill, window_seconds
from promserver import STEP, prometheus

GPUS = 1000
POOLS = 10
WORKLOADS = 100
CYCLE = 30.0


def write_data(path: Path, start: float, points: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    t = np.arange(points)
    times = [f"{start + i * STEP:.1f}" for i in range(points)]
    with path.open("w", encoding="utf-8") as out:
        out.write("# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n")
        for g in range(GPUS):
            pool, workload = g % POOLS, g // (GPUS // WORKLOADS)
            base = rng.uniform(20, 80) + 10 * np.sin(t / rng.uniform(2000, 9000))
            values = np.clip(base + rng.normal(0, 4, points), 0, 100)
            labels = (
                f'DCGM_FI_DEV_GPU_UTIL{{Hostname="n{g // 8}",UUID="G{g}",gpu="{g % 8}",'
                f'modelName="pool-{pool}",namespace="w{workload}",pod="w{workload}-{g}"}} '
            )
            out.writelines(f"{labels}{v:.1f} {ts}\n" for v, ts in zip(values, times, strict=True))
        out.write("# EOF\n")


def cpu_of_tick(tick: Any, now: float, url: str) -> tuple[float, float]:
    """(CPU seconds of this process and of Prometheus, wall seconds) of `tick.tick(now)`."""
    prom, cpu, began = prometheus_cpu(url), time.process_time(), time.perf_counter()
    tick.tick(now)
    wall = time.perf_counter() - began
    return time.process_time() - cpu + prometheus_cpu(url) - prom, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=5)
    args = parser.parse_args()
    window = window_seconds()
    end = math.floor(time.time()) - 10
    extra = int(args.cycles * CYCLE / STEP)  # samples the steady ticks will read
    points = int(window / STEP) + extra
    start = end - (points - 1) * STEP
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "gpus.om"
        write_data(data, start, points, seed=1)
        with prometheus(data) as url:
            steady, source = controller(cluster_config(url, POOLS, WORKLOADS))
            whole = "background_backfill: false"  # the whole window read in the tick
            first_now = end - extra * STEP
            steady.tick(first_now)
            wait_backfill(source)
            rows = []
            for c in range(1, args.cycles + 1):
                now = first_now + c * CYCLE
                fresh, read = controller(cluster_config(url, POOLS, WORKLOADS, whole))
                rows.append((*cpu_of_tick(steady, now, url), cpu_of_tick(fresh, now, url)[0]))
                read.close()
                print(
                    f"tick {c}: steady {rows[-1][0]:.3f} CPU-s ({rows[-1][1]:.3f} s), "
                    f"refetching {rows[-1][2]:.3f} CPU-s",
                    file=sys.stderr,
                    flush=True,
                )
            if not source.health.ok:
                raise SystemExit(f"the controller's reads failed: {source.health}")
    s, wall, r = (statistics.median(row[i] for row in rows) for i in range(3))
    print(
        f"RESULT window_s={window:.0f} steady_cpu_s={s:.3f} refetch_cpu_s={r:.3f} "
        f"ratio={r / s:.1f} steady_tick_s={wall:.3f}"
    )


if __name__ == "__main__":
    main()
