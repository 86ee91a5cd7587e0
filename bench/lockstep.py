"""The controller's cost per tick in the what-if replay: N workloads ticked each alone
(one controller each, as whatif did before `--lanes`) against N in lockstep through one
controller (`gpuscaler.sim.lockstep`), for N = 1, 10, 100 by default.

Each workload's demand is the bundled Azure LLM conversation week, rotated and scaled per
workload as bench/whatif.py plants it, replayed at whatif's slot (10 s) for `--hours`
from day 4 at noon (busy hours). Measured, per run: the wall time of the gpuscaler runs
(cluster simulation, controller ticks), the time inside the controller's ticks
(`TickResult.seconds`) and, within them, the core's snapshot (the forecasts of every
pool's and workload's series: `build_snapshot`), per tick and per workload-tick. The runs
alone are timed on the first `--alone` workloads (their cost is linear in N); the
lockstep on all N. The lanes' figures are checked equal to the runs alone (those timed).

Last line:
  RESULT hours=H forecast_ms_per_tick_1= forecast_ms_per_tick_10= forecast_ms_per_tick_100=
  alone_ms_per_workload_tick= lockstep_ms_per_workload_tick_100= speedup_100= ...
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import gpuscaler.controller as controller_module
from gpuscaler.config import Config, parse_config
from gpuscaler.sim.lockstep import lockstep_runs
from gpuscaler.sim.replay import workload_config
from gpuscaler.sim.simulate import Prepared, RunResult, finish, gpuscaler_run, prepare
from gpuscaler.sim.trace import Trace, load_trace

START_HOURS = 3 * 24 + 12.0
SNAPSHOT = "build_snapshot"
"""The core's forecasts, as the controller calls them (timed by wrapping it there)."""


def config(n: int) -> Config:
    lines = [
        "simulator: {preemption_burst_after: null, slot: 10s}",
        "node_pools:",
        "  - {name: a100-80gb, selector: {label: nvidia.com/gpu.product, value: A100},",
        "     gpu_memory_gib: 80, workload_type: inference, profile: compute_bound,",
        "     initial_fragments: 2}",
        "workloads:",
    ]
    lines += [
        f"  - {{namespace: bench, kind: ScaledObject, name: w{i:03d}, node_pool: a100-80gb,"
        " overrides: {replicas: {max_replicas: 200}}}"
        for i in range(n)
    ]
    return parse_config("\n".join(lines) + "\n")


def trace(i: int, base: Trace) -> Trace:
    """bench/whatif.py's workload i: the week rotated by i x 6047 bins, scaled."""
    counts = np.roll(base.counts, -((i * 6047) % len(base.counts))) * (0.5 + (i % 10) / 10)
    return Trace(f"w{i:03d}", base.start, base.bin_seconds, counts)


class Timer:
    """Seconds inside `build_snapshot` (the forecasts), summed over calls."""

    def __init__(self) -> None:
        self.seconds, self.calls = 0.0, 0
        self.inner: Callable[..., Any] = getattr(controller_module, SNAPSHOT)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1


def timed(run: Callable[[], list[RunResult]]) -> tuple[list[RunResult], float, float, int]:
    """(runs, wall seconds, seconds in build_snapshot, its calls)."""
    timer = Timer()
    setattr(controller_module, SNAPSHOT, timer)
    try:
        t0 = time.perf_counter()
        runs = run()
        return runs, time.perf_counter() - t0, timer.seconds, timer.calls
    finally:
        setattr(controller_module, SNAPSHOT, timer.inner)


def figures(p: Prepared, run: RunResult) -> str:
    return json.dumps(finish(p, run, baselines=False).summary()["gpuscaler"], sort_keys=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,10,100", help="workloads in lockstep")
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--alone", type=int, default=5, help="workloads timed alone")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    base = load_trace()
    cfg = config(max(sizes))
    preps = [
        prepare(trace(i, base), args.hours, 1, workload_config(cfg, w, 10.0), START_HOURS)
        for i, w in enumerate(cfg.workloads)
    ]
    ticks = round(args.hours * 3600 / cfg.control.interval)
    k = min(args.alone, len(preps))
    alone, wall, snap, calls = timed(lambda: [gpuscaler_run(p) for p in preps[:k]])
    alone_ms = 1000 * wall / (k * ticks)
    alone_snap_ms = 1000 * snap / calls
    print(
        f"alone: {k} workloads x {ticks} ticks in {wall:.1f}s: {alone_ms:.2f} ms a "
        f"workload-tick, forecast {alone_snap_ms:.2f} ms of it",
        file=sys.stderr,
    )
    out = [f"hours={args.hours:g}", f"alone_ms_per_workload_tick={alone_ms:.2f}"]
    out.append(f"alone_forecast_ms_per_workload_tick={alone_snap_ms:.2f}")
    for n in sizes:
        runs, wall, snap, calls = timed(lambda n=n: lockstep_runs(preps[:n]))  # type: ignore[misc]
        same = all(
            figures(p, r) == figures(p, a) for p, r, a in zip(preps, runs, alone, strict=False)
        )
        per = 1000 * wall / (n * ticks)
        forecast = 1000 * snap / calls
        print(
            f"lockstep {n}: {wall:.1f}s, {per:.2f} ms a workload-tick, forecast "
            f"{forecast:.2f} ms a tick ({forecast / n:.2f} a workload); same figures as "
            f"alone: {same}",
            file=sys.stderr,
        )
        if not same:
            raise SystemExit(f"lockstep of {n}: figures differ from the runs alone")
        out += [
            f"forecast_ms_per_tick_{n}={forecast:.2f}",
            f"lockstep_ms_per_workload_tick_{n}={per:.2f}",
            f"speedup_{n}={alone_ms / per:.2f}",
        ]
    print("RESULT " + " ".join(out))


if __name__ == "__main__":
    main()
