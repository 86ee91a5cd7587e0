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

Also measured: the CPU time of the lockstep runs a workload-tick (`cpu_ms_per_workload_tick_N`,
other jobs on the shared cores count less) and the plan's share (`make_plan`, the replica
floors' skill and reserve: `plan_ms_per_tick_N`). `--base REV` times another revision
(unpacked by `git archive`, bench/revision.py) and this tree in child processes, alternated
`--rounds` times, and prints both (the base's keys end in `_base`; medians of the rounds).

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
from revision import alternated, medians

import gpuscaler.controller as controller_module
from gpuscaler.config import Config, parse_config
from gpuscaler.sim.lockstep import lockstep_runs
from gpuscaler.sim.replay import workload_config
from gpuscaler.sim.simulate import Prepared, RunResult, finish, gpuscaler_run, prepare
from gpuscaler.sim.trace import Trace, load_trace

START_HOURS = 3 * 24 + 12.0
SNAPSHOT = "build_snapshot"
"""The core's forecasts, as the controller calls them (timed by wrapping it there)."""
PLAN = "make_plan"
"""The core's plan (the replica floors' skill and reserve), timed the same way."""


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
    """Seconds inside the controller's `name` (the forecasts, the plan), summed over calls."""

    def __init__(self, name: str) -> None:
        self.name, self.seconds, self.calls = name, 0.0, 0
        self.inner: Callable[..., Any] = getattr(controller_module, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1


def prepared(hours: float, n: int) -> list[Prepared]:
    """The first `hours` of n workloads' traces (each rotated, from START_HOURS), prepared
    for a replay at 10 s slots under config(n)."""
    base, cfg = load_trace(), config(n)
    return [
        prepare(trace(i, base), hours, 1, workload_config(cfg, w, 10.0), START_HOURS)
        for i, w in enumerate(cfg.workloads)
    ]


def timed(
    run: Callable[[], list[RunResult]],
) -> tuple[list[RunResult], float, float, dict[str, Timer]]:
    """(runs, wall seconds, CPU seconds, the timers of build_snapshot and make_plan)."""
    timers = {name: Timer(name) for name in (SNAPSHOT, PLAN)}
    for name, timer in timers.items():
        setattr(controller_module, name, timer)
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        runs = run()
        return runs, time.perf_counter() - t0, time.process_time() - c0, timers
    finally:
        for name in (SNAPSHOT, PLAN):
            setattr(controller_module, name, timers[name].inner)


def figures(p: Prepared, run: RunResult) -> str:
    return json.dumps(finish(p, run, baselines=False).summary()["gpuscaler"], sort_keys=True)


def measure(sizes: list[int], hours: float, alone_n: int) -> list[str]:
    """The RESULT fields of this process' gpuscaler at each lockstep size."""
    preps = prepared(hours, max(sizes))
    ticks = round(hours * 3600 / preps[0].config.control.interval)
    k = min(alone_n, len(preps))
    alone, wall, _, timers = timed(lambda: [gpuscaler_run(p) for p in preps[:k]])
    alone_ms = 1000 * wall / (k * ticks)
    alone_snap_ms = 1000 * timers[SNAPSHOT].seconds / timers[SNAPSHOT].calls
    print(
        f"alone: {k} workloads x {ticks} ticks in {wall:.1f}s: {alone_ms:.2f} ms a "
        f"workload-tick, forecast {alone_snap_ms:.2f} ms of it",
        file=sys.stderr,
    )
    out = [f"hours={hours:g}", f"alone_ms_per_workload_tick={alone_ms:.2f}"]
    out.append(f"alone_forecast_ms_per_workload_tick={alone_snap_ms:.2f}")
    for n in sizes:
        runs, wall, cpu_s, timers = timed(lambda n=n: lockstep_runs(preps[:n]))  # type: ignore[misc]
        same = all(
            figures(p, r) == figures(p, a) for p, r, a in zip(preps, runs, alone, strict=False)
        )
        per = 1000 * wall / (n * ticks)
        forecast = 1000 * timers[SNAPSHOT].seconds / timers[SNAPSHOT].calls
        planned = 1000 * timers[PLAN].seconds / timers[PLAN].calls
        cpu = 1000 * cpu_s / (n * ticks)
        print(
            f"lockstep {n}: {wall:.1f}s, {per:.2f} ms a workload-tick ({cpu:.2f} ms of CPU), "
            f"forecast {forecast:.2f} ms a tick ({forecast / n:.2f} a workload), plan "
            f"{planned:.2f} ms a tick ({planned / n:.2f} a workload); same figures as alone: "
            f"{same}",
            file=sys.stderr,
        )
        if not same:
            raise SystemExit(f"lockstep of {n}: figures differ from the runs alone")
        out += [
            f"forecast_ms_per_tick_{n}={forecast:.2f}",
            f"plan_ms_per_tick_{n}={planned:.2f}",
            f"lockstep_ms_per_workload_tick_{n}={per:.2f}",
            f"cpu_ms_per_workload_tick_{n}={cpu:.2f}",
            f"speedup_{n}={alone_ms / per:.2f}",
        ]
    return out


def against_base(args: argparse.Namespace) -> list[str]:
    """The base revision and this tree alternated in child processes: medians of each
    field over the rounds, the base's with `_base`."""
    cmd = [sys.executable, __file__, "--sizes", args.sizes, "--hours", str(args.hours)]
    cmd += ["--alone", str(args.alone)]
    rows = alternated(args.base, args.rounds, {"base": cmd, "": cmd})
    return medians(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,10,100", help="workloads in lockstep")
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--alone", type=int, default=5, help="workloads timed alone")
    ap.add_argument("--base", help="also time this git revision, alternated")
    ap.add_argument("--rounds", type=int, default=2, help="rounds with --base")
    args = ap.parse_args()
    if args.base:
        out = against_base(args)
    else:
        out = measure([int(x) for x in args.sizes.split(",")], args.hours, args.alone)
    print("RESULT " + " ".join(out))


if __name__ == "__main__":
    main()
