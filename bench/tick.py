"""A whole controller tick at 1,000 and 10,000 GPUs against a real Prometheus (issue 18).

For N GPUs: N/100 node pools (by modelName), N/10 workloads of 10 GPUs (Deployment pods),
and per GPU the four series a tick reads (utilization, stall, frame buffer used and free)
at 500 ms, backfilled by promtool. The recording rules' series are planted as
Prometheus would have recorded them at a phase of 0 (on the 500 ms grid): the workload
rule's (`gpuscaler:workload_gpu_utilization:sum`, the rule itself tested against the
per-target sums in tests/test_prometheus_grouped.py) and the pool rules'
(`gpuscaler:pool_gpu_utilization:avg`, `gpuscaler:pool_gpu_stall:avg`), which are checked
here against Prometheus' own evaluation of the shipped rule expressions over the raw
series (bench/rulecost.py). What the rules cost Prometheus continuously is measured too:
each rule group's evaluation time (Prometheus' own, from the answer's stats) as a share
of one core at the group's interval.

What is measured, in one run per size:
- a throwaway first tick to warm Prometheus (page cache, start-up compaction);
- the first tick (forecast, plan, and the reads: the whole window for the per-target
  baseline, one query per target; forecast.min_history for grouped reads, whose
  background backfill of the rest is then timed to its end as `backfill_10k_s`);
- `--cycles` (5) steady ticks 30 s apart (only the new points cross the wire),
  alternating between grouped reads with the pool rules (the default), the same reading
  the frame-buffer totals every tick (`prometheus.memory_total_every: 0`, the baseline of
  keeping them), grouped reads of the raw series (`prometheus.pool_recording_rules:
  false`) and per-target reads, so drift in the machine's load hits all of them; each
  variant's figure is the median of its steady ticks. On these ticks the pools'
  frame-buffer totals rest (read every `prometheus.memory_total_every`, 5 min: 1 tick
  in 10 at 30 s);
- then one more tick 30 s later with the kept totals forgotten, as every 5 minutes: the
  steady tick that re-reads them (`refresh_10k_tick_s`), not in the median;
- queries per steady tick, and this process' peak RSS (`bench_rss_10k_mb`: all variants
  held in memory at once);
- then the default grouped controller alone in a child process (bench/tickone.py): its
  peak RSS is `rss_10k_mb` (one controller, the gate's figure), its steady ticks
  `one_*_tick_s`, with the CPU time it and Prometheus spent (`one_10k_cpu_s`,
  `one_10k_prometheus_cpu_s`; `--one-profile` adds cProfile's top functions); then the
  same asking for gzipped answers (`one_gzip_*`, the same-run baseline of
  `transport.PLAIN`).

The window is shortened: 10,000 GPUs x 4 series x 1 h at 500 ms is 288 million samples,
past what promtool backfills on this machine in reasonable time. The config's window is
10 min (the shortest the forecast settings accept), and only the last PLANTED seconds of it
hold samples, so the first-tick figure is a lower bound of a full-hour backfill; steady
ticks read only new points, so they do not depend on the window's length. Cluster state
is fixed (no API server): the watch cache makes it a memory read (tests/test_watch_cache.py).

Last line: RESULT gpus_1k_tick_s= gpus_10k_tick_s= first_tick_10k_s= queries_per_tick_10k=
rss_10k_mb= (plus the refresh ticks, the raw-grouped and per-target baselines, ratios, and
the rule groups' share of a core). `--sizes 1000` is the quick mode (about 1 min).
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from promserver import STEP, prometheus
from rulecost import check_planted, evaluation_cost

import gpuscaler.adapters.prometheus.source as source_module
import gpuscaler.controller as controller_module
from gpuscaler.adapters.kube.objects import CurrentState
from gpuscaler.adapters.prometheus.fetch import Fetcher
from gpuscaler.config import Config, parse_config
from gpuscaler.controller import Controller
from gpuscaler.sources import PrometheusSource

CYCLE = 30.0
PLANTED = 100.0
"""Seconds of samples before the first tick (the rest of the 10 min window is empty)."""
HASH = "7d4f8b9c6"
POOL_RULE_SERIES = {
    "DCGM_FI_DEV_GPU_UTIL": "gpuscaler:pool_gpu_utilization:avg",
    "nvidia_gpu_stall_percentage": "gpuscaler:pool_gpu_stall:avg",
}
"""Raw series -> what the shipped pool rule (group gpuscaler-pools) records of it."""
ONE_FLAGS: list[str] = []
"""Passed on to bench/tickone.py (`--one-profile`, `--one-tracemalloc`)."""
VARIANTS = ("grouped", "grouped_total", "grouped_raw", "per_target")
"""grouped: as configured by default (pool rules read where recorded); grouped_total: the
same reading the frame-buffer totals every tick (`prometheus.memory_total_every: 0`, as
before it was kept); grouped_raw: grouped with `prometheus.pool_recording_rules: false`;
per_target: one query per target (`prometheus.grouped_queries: false`)."""


def write_data(path: Path, gpus: int, start: float, points: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    times = [f" {start + i * STEP:.1f}\n" for i in range(points)]
    workloads = gpus // 10
    load = np.zeros((workloads, points))

    def series(out: Any, name: str, labels: str, values: np.ndarray, exact: bool = False) -> None:
        """Raw series in tenths, as dcgm-exporter gives them; recorded ones in full."""
        head = f"{name}{{{labels}}} "
        text = [f"{v!r}" if exact else f"{v:.1f}" for v in values.tolist()]
        out.write("".join(f"{head}{v}{t}" for v, t in zip(text, times, strict=True)))

    t = np.arange(points)
    pools = gpus // 100
    pooled = {s: np.zeros((pools, points)) for s in POOL_RULE_SERIES}
    with path.open("w", encoding="utf-8") as out:
        for name in ("DCGM_FI_DEV_GPU_UTIL", "nvidia_gpu_stall_percentage"):
            out.write(f"# TYPE {name} gauge\n")
            for g in range(gpus):
                w = g // 10
                base = rng.uniform(20, 80) + 10 * np.sin(t / rng.uniform(200, 900))
                values = np.clip(base + rng.normal(0, 4, points), 0, 100).round(1)
                if name == "DCGM_FI_DEV_GPU_UTIL":
                    load[w] += values
                else:
                    values = (values / 5).round(1)  # printed as is: what Prometheus holds
                pooled[name][g % pools] += values
                labels = (
                    f'Hostname="n{g // 8}",UUID="G{g}",modelName="pool-{g % pools}",'
                    f'namespace="w{w}",pod="w{w}-{HASH}-b{g % 10}x2z"'
                )
                series(out, name, labels, values)
        for name, value in (("DCGM_FI_DEV_FB_USED", 30_000.0), ("DCGM_FI_DEV_FB_FREE", 50_000.0)):
            out.write(f"# TYPE {name} gauge\n")
            flat = np.full(points, value)
            for g in range(gpus):
                labels = f'Hostname="n{g // 8}",UUID="G{g}",modelName="pool-{g % (gpus // 100)}"'
                series(out, name, labels, flat)
        name = "gpuscaler:workload_gpu_utilization:sum"
        out.write(f"# TYPE {name} gauge\n")
        for w in range(workloads):
            series(out, name, f'namespace="w{w}",workload="w{w}"', load[w], exact=True)
        # The pool rules (group gpuscaler-pools): every GPU has a sample at each grid
        # time, so `avg by (modelName) (last_over_time(X[1s]))` evaluated there is the
        # mean of the pool's samples at that time (checked against Prometheus' own
        # evaluation of the rule on the raw series in `check_rules`).
        for raw, recorded in POOL_RULE_SERIES.items():
            out.write(f"# TYPE {recorded} gauge\n")
            for p in range(pools):
                mean = pooled[raw][p] / (gpus // pools)
                series(out, recorded, f'modelName="pool-{p}"', mean, exact=True)
        out.write("# EOF\n")


def config(
    url: str, gpus: int, grouped: bool, rules: bool = True, total_every: str = "5m"
) -> Config:
    pools = "\n".join(
        f"  - {{name: pool-{p}, selector: {{label: pool, value: p{p}}}, gpu_memory_gib: 80, "
        f"initial_fragments: 2, metrics_matchers: {{modelName: pool-{p}}}}}"
        for p in range(gpus // 100)
    )
    workloads = "\n".join(
        f"  - {{namespace: w{w}, kind: ScaledObject, name: w{w}}}" for w in range(gpus // 10)
    )
    return parse_config(
        f'prometheus: {{url: "{url}", timeout: 60s, grouped_queries: {str(grouped).lower()}, '
        f"pool_recording_rules: {str(rules).lower()}, memory_total_every: {total_every}}}\n"
        "metrics: {window: 10m}\n"
        "forecast: {min_history: 90s}\n"  # every target forecast from the planted 100 s
        f"control: {{dry_run: true}}\nnode_pools:\n{pools}\nworkloads:\n{workloads}\n"
    )


PHASES = ("requests", "decode", "prefetch", "windows", "forecast", "plan")
"""A steady tick's phases: the grouped queries' HTTP requests (Prometheus' evaluation,
the transfer and orjson; summed over the concurrent queries) and numpy decoding, the
prefetch's wall time (those, run concurrently, and cutting the answers per target), the
per-target window bookkeeping (the rest of the reads), `build_snapshot`, `make_plan`."""
SPENT = dict.fromkeys((*PHASES, "observe"), 0.0)


class Timed:
    """Wall time of a callable, added to `spent[name]` at each call."""

    def __init__(self, spent: dict[str, float], name: str, fn: Callable[..., Any]):
        self.spent, self.name, self.fn = spent, name, fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.spent[self.name] += time.perf_counter() - began


def _timed(phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` timed into `SPENT[phase]`, as a function (bound when set on a class)."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[phase] += time.perf_counter() - began

    return timed


def time_phases() -> None:
    """Time the phases (`PHASES`) in `SPENT` from now on."""
    for owner, name, phase in (
        (controller_module, "build_snapshot", "forecast"),
        (controller_module, "make_plan", "plan"),
        (Fetcher, "query", "requests"),
        (source_module, "decode_matrix", "decode"),
    ):
        setattr(owner, name, _timed(phase, getattr(owner, name)))


def phases_of_tick(controller: Controller, now: float) -> dict[str, float]:
    """One tick's phases, and its whole wall time as `tick`."""
    for name in SPENT:
        SPENT[name] = 0.0
    began = time.perf_counter()
    controller.tick(now)
    row = dict(SPENT, tick=time.perf_counter() - began)
    row["windows"] = row.pop("observe") - row["prefetch"]
    return row


class NoActuator:
    def apply(self, decisions: object) -> tuple[()]:
        return ()


def _time_observe(source: Any) -> None:
    """Time each `observe` (the Prometheus reads) and the grouped prefetch in `SPENT`."""
    source.observe = Timed(SPENT, "observe", source.observe)
    fetcher = source.metrics.fetcher
    fetcher.prefetch = Timed(SPENT, "prefetch", fetcher.prefetch)


def _forget_totals(source: Any) -> None:
    """The kept frame-buffer totals forgotten, as when they are due (a revision without
    them reads them every tick anyway)."""
    totals = getattr(source.metrics, "totals", None)
    if totals is not None:
        totals.kept.clear()


def _steady_ticks(
    gpus: int,
    runs: dict[str, tuple[Controller, Any, float, list[float], list[int]]],
    first_now: float,
    cycles: int,
    out: dict[str, float],
) -> None:
    """The steady ticks after each variant's first, then the refresh tick; figures into
    `out` (medians of the steady ticks)."""
    observed: dict[str, list[float]] = {tag: [] for tag in VARIANTS}
    split: dict[str, list[dict[str, float]]] = {tag: [] for tag in VARIANTS}
    # Steady ticks alternate between the variants, so drift in the machine's load
    # hits all of them; the last re-reads the frame-buffer totals.
    for c in range(1, cycles + 2):
        for tag in VARIANTS:
            controller, source, _, steady, queries = runs[tag]
            if c > cycles:
                _forget_totals(source)
            row = phases_of_tick(controller, first_now + c * CYCLE)
            if c > cycles:
                out[f"{tag}_refresh"] = row["tick"]
                out[f"{tag}_refresh_queries"] = source.queries_last_tick
                print(
                    f"[{gpus}] {tag}: refresh tick (totals read again) "
                    f"{row['tick']:.2f} s, phases "
                    + ", ".join(f"{n} {row[n]:.3f}" for n in PHASES)
                    + f" s; queries {source.queries_last_tick}",
                    flush=True,
                )
                continue
            steady.append(row["tick"])
            queries.append(source.queries_last_tick)
            observed[tag].append(row["prefetch"] + row["windows"])
            split[tag].append(row)
    for tag, (_, source, first, steady, queries) in runs.items():
        assert source.health.ok  # the source logged why, if not
        print(
            f"[{gpus}] {tag}: first tick {first:.2f}s; steady "
            f"{', '.join(f'{s:.2f}' for s in steady)} s (Prometheus reads "
            f"{', '.join(f'{s:.2f}' for s in observed[tag])} s); "
            f"queries/tick {queries}",
            flush=True,
        )
        for row in split[tag]:
            print(
                f"[{gpus}] {tag}: phases " + ", ".join(f"{n} {row[n]:.3f}" for n in PHASES) + " s",
                flush=True,
            )
        out[f"{tag}_first"] = first
        out[f"{tag}_steady"] = statistics.median(steady)
        out[f"{tag}_queries"] = statistics.median(queries)


def run(gpus: int, cycles: int) -> dict[str, float]:
    end = math.floor(time.time()) - 10
    extra = int((cycles + 1) * CYCLE / STEP)  # the steady ticks and the refresh tick
    points = int(PLANTED / STEP) + extra
    start = end - (points - 1) * STEP
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "gpus.om"
        began = time.perf_counter()
        write_data(data, gpus, start, points, seed=gpus)
        size = data.stat().st_size / 1e6
        print(
            f"[{gpus}] planted {points} points/series ({size:.0f} MB) in "
            f"{time.perf_counter() - began:.0f}s",
            flush=True,
        )
        began = time.perf_counter()
        with prometheus(data, backfill_timeout=3600) as url:
            print(
                f"[{gpus}] backfilled + started Prometheus in {time.perf_counter() - began:.0f}s",
                flush=True,
            )
            first_now = end - extra * STEP
            # Warm Prometheus (page cache, chunk mmaps, start-up compaction) with a
            # throwaway first tick, so neither variant pays for a cold server.
            warm = config(url, gpus, True)
            warming = PrometheusSource(warm, CurrentState())
            Controller(warm, warming, NoActuator(), dry_run=True, log_decisions=False).tick(
                first_now
            )
            assert warming.metrics.backfill.wait(timeout=600)  # the whole window, read
            worst = check_planted(url, start, end, STEP)
            print(f"[{gpus}] planted pool rules vs Prometheus' evaluation: max |diff| {worst:.2e}")
            assert worst < 1e-9
            cost = evaluation_cost(url, [first_now + k * CYCLE / 4 for k in range(4 * cycles + 1)])
            for name, (wall, cpu, share) in cost.items():
                print(
                    f"[{gpus}] rule group {name}: {wall * 1000:.1f} ms per evaluation "
                    f"(Prometheus' stats), {cpu * 1000:.1f} ms of CPU: {share:.0%} of a core",
                    flush=True,
                )
                out[f"rules_{name}"] = share
            runs: dict[str, tuple[Controller, Any, float, list[float], list[int]]] = {}
            for tag in VARIANTS:
                cfg = config(
                    url,
                    gpus,
                    tag != "per_target",
                    rules=tag in ("grouped", "grouped_total"),
                    total_every="0s" if tag == "grouped_total" else "5m",
                )
                source = PrometheusSource(cfg, CurrentState())
                controller = Controller(
                    cfg, source, NoActuator(), dry_run=True, log_decisions=False
                )
                began = time.perf_counter()
                controller.tick(first_now)
                runs[tag] = (controller, source, time.perf_counter() - began, [], [])
                assert source.metrics.backfill.wait(timeout=600)  # the rest, read behind
                out[f"{tag}_backfill"] = time.perf_counter() - began
                _time_observe(source)
            _steady_ticks(gpus, runs, first_now, cycles, out)
            out["bench_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            from tickone import alone  # it imports this module

            # One controller alone as shipped, then asking for gzipped answers: the
            # same-run baseline of uncompressed answers.
            for tag, flags in (("one", []), ("one_gzip", ["--gzip"])):
                alone(url, gpus, first_now, cycles, out, tag, [*ONE_FLAGS, *flags])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--one-profile", action="store_true", help="cProfile the child")
    parser.add_argument("--one-tracemalloc", action="store_true", help="its top allocations")
    args = parser.parse_args()
    ONE_FLAGS.extend(["--profile"] * args.one_profile + ["--tracemalloc"] * args.one_tracemalloc)
    time_phases()
    results = {int(n): run(int(n), args.cycles) for n in args.sizes.split(",")}
    print(f"load average (1, 5, 15 min) at the end: {os.getloadavg()}")
    small, big = results.get(1000, {}), results.get(10000, {})
    fields = [
        f"gpus_1k_tick_s={small.get('grouped_steady', float('nan')):.3f}",
        f"gpus_10k_tick_s={big.get('grouped_steady', float('nan')):.3f}",
        f"first_tick_10k_s={big.get('grouped_first', float('nan')):.2f}",
        f"queries_per_tick_10k={big.get('grouped_queries', float('nan')):.0f}",
        f"rss_10k_mb={big.get('one_rss_mb', float('nan')):.0f}",
        f"bench_rss_10k_mb={big.get('bench_rss_mb', float('nan')):.0f}",
        f"backfill_10k_s={big.get('grouped_backfill', float('nan')):.2f}",
    ]
    for name, r in (("1k", small), ("10k", big)):
        if r:
            fields.append(f"refresh_{name}_tick_s={r['grouped_refresh']:.3f}")
    for name, r in (("1k", small), ("10k", big)):
        for tag in ("one", "one_gzip") if r else ():
            fields.append(f"{tag}_{name}_tick_s={r[f'{tag}_steady']:.3f}")
            fields.append(f"{tag}_{name}_cpu_s={r[f'{tag}_cpu']:.3f}")
            fields.append(f"{tag}_{name}_prometheus_cpu_s={r[f'{tag}_prom_cpu']:.3f}")
            fields.append(f"{tag}_{name}_gc_s={r[f'{tag}_gc']:.3f}")
    for name, r in (("1k", small), ("10k", big)):
        if r:
            fields.append(f"total_every_tick_{name}_tick_s={r['grouped_total_steady']:.3f}")
            fields.append(
                f"total_kept_speedup_{name}={r['grouped_total_steady'] / r['grouped_steady']:.2f}"
            )
            fields.append(f"grouped_raw_{name}_tick_s={r['grouped_raw_steady']:.3f}")
            fields.append(
                f"rules_speedup_{name}={r['grouped_raw_steady'] / r['grouped_steady']:.2f}"
            )
            for group in ("gpuscaler-pools", "gpuscaler-workloads"):
                short = group.split("-")[1]
                fields.append(f"rule_{short}_core_share_{name}={r[f'rules_{group}']:.3f}")
            fields.append(f"per_target_{name}_tick_s={r['per_target_steady']:.3f}")
            fields.append(f"per_target_{name}_queries={r['per_target_queries']:.0f}")
            fields.append(f"speedup_{name}={r['per_target_steady'] / r['grouped_steady']:.1f}")
    print("RESULT " + " ".join(fields))


if __name__ == "__main__":
    main()
