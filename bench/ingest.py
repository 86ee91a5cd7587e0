"""Ingestion benchmark against a real Prometheus: 1,000 GPU series at 500 ms over 1 h.

Backfills (promtool) 1,000 GPUs: 10 node pools (by modelName) and 100 workloads of 10 GPUs
(namespace/pod). Then, in one run:
- the first full fetch (every pool and workload, the whole hour, in chunks);
- steady-state cycles 30 s apart: incremental fetch + forecast + plan (the real tick);
- the same cycles refetching the whole window every time (a fresh source each cycle).
Prometheus' clock is real: "now" is the end of the planted data, advanced 30 s per cycle
(the newest 30 s are planted too, so incremental cycles have new samples to read).

Last line: RESULT steady_cycle_s=<median> refetch_cycle_s=<median> ratio=<refetch/steady>
rss_mb=<MB>
"""

from __future__ import annotations

import argparse
import math
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from promserver import STEP, prometheus

from gpuscaler.adapters.kube.objects import CurrentState
from gpuscaler.config import parse_config
from gpuscaler.controller import Controller
from gpuscaler.sources import PrometheusSource

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


def config_text(url: str) -> str:
    pools = "\n".join(
        f"  - {{name: pool-{p}, selector: {{label: pool, value: p{p}}}, gpu_memory_gib: 80, "
        f"initial_fragments: 2, metrics_matchers: {{modelName: pool-{p}}}}}"
        for p in range(POOLS)
    )
    workloads = "\n".join(
        f"  - {{namespace: w{w}, kind: ScaledObject, name: w{w}}}" for w in range(WORKLOADS)
    )
    return (
        f'prometheus: {{url: "{url}", timeout: 30s}}\n'
        f"control: {{dry_run: true}}\nnode_pools:\n{pools}\nworkloads:\n{workloads}\n"
    )


class NoActuator:
    def apply(self, decisions: object) -> tuple[()]:
        return ()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=5)
    args = parser.parse_args()
    end = math.floor(time.time()) - 10
    extra = int(args.cycles * CYCLE / STEP)  # samples the steady cycles will read
    points = int(3600 / STEP) + extra
    start = end - (points - 1) * STEP
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "gpus.om"
        began = time.perf_counter()
        write_data(data, start, points, seed=1)
        print(
            f"planted {GPUS} GPU series x {points} points ({data.stat().st_size / 1e6:.0f} MB "
            f"OpenMetrics) in {time.perf_counter() - began:.1f}s",
            flush=True,
        )
        began = time.perf_counter()
        with prometheus(data) as url:
            print(
                f"backfilled and started Prometheus in {time.perf_counter() - began:.1f}s",
                flush=True,
            )
            config = parse_config(config_text(url))
            source = PrometheusSource(config, CurrentState())
            controller = Controller(config, source, NoActuator(), dry_run=True, log_decisions=False)
            first_now = end - extra * STEP
            began = time.perf_counter()
            controller.tick(first_now)
            first = time.perf_counter() - began
            steady = []
            for c in range(1, args.cycles + 1):
                began = time.perf_counter()
                controller.tick(first_now + c * CYCLE)
                steady.append(time.perf_counter() - began)
            refetch = []
            for c in range(1, args.cycles + 1):
                fresh = Controller(
                    config,
                    PrometheusSource(config, CurrentState()),
                    NoActuator(),
                    dry_run=True,
                    log_decisions=False,
                )
                began = time.perf_counter()
                fresh.tick(first_now + c * CYCLE)
                refetch.append(time.perf_counter() - began)
            assert source.health.ok  # the source logged why, if not
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    s, r = statistics.median(steady), statistics.median(refetch)
    print(
        f"first full fetch + forecast + plan: {first:.2f}s ({POOLS} pools, {WORKLOADS} workloads)"
    )
    print(f"steady cycles: {', '.join(f'{x:.2f}' for x in steady)} s")
    print(f"refetch-everything cycles: {', '.join(f'{x:.2f}' for x in refetch)} s")
    print(
        f"RESULT steady_cycle_s={s:.3f} refetch_cycle_s={r:.3f} ratio={r / s:.1f} "
        f"rss_mb={rss_mb:.0f}"
    )


if __name__ == "__main__":
    main()
