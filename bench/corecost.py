"""The controller core's cost in a steady tick at N GPUs, Python only (issues 18 and 20).

One controller ticks every 30 s over N/100 pools and N/10 workloads (bench/tick.py's
config), observing from a fake source that hands the core what the Prometheus reads
hand it: each pool's utilization and stall and each workload's load as 500 ms windows of
the last 10 minutes (a daily-ish wave, noise, a burst now and then, about 1 % gaps), and
each workload's replica floor and replicas. No HTTP, no Kubernetes: what is timed is the
core, the forecast phase (`build_snapshot`) and the plan (`plan`), per tick. The first
ticks fill the windows (forecasts start after `forecast.min_history`), then `--ticks`
steady ticks are timed; a refit (every 5 minutes) falls inside them as in a real run.
`--seen K` starts every workload's floor history with K earlier ticks' records (a
controller that has run for hours holds 250: `replicas.reserve_window` plus the
stabilization window, at 30 s), which the skill and the reserve score at every tick.
Times are CPU seconds of the child process, so other jobs on the shared cores count less.

The baseline is another revision of gpuscaler (`--base`, default the branch's start),
extracted with `git archive` and run in a child process alternately with the worktree's
code, so load drift hits both. Run it niced: `nice -n 10 .venv/bin/python bench/corecost.py`.

Last line: RESULT gpus= seen= core_base_s= core_s= speedup= forecast_base_s= forecast_s=
plan_base_s= plan_s= (medians over the timed ticks, then over the rounds, in seconds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from revision import unpack

ROOT = Path(__file__).resolve().parent.parent
START = 1_800_000_000.0
STEP = 0.5
WINDOW = 600.0


class FakeCluster:
    """Observations of every pool and workload: windows cut from one long array per
    signal family, each series at its own offset and scale."""

    name = "fake"

    def __init__(self, pools: list[str], workloads: list[str], seconds: float):
        from gpuscaler.core.model import Series
        from gpuscaler.core.snapshot import Observations, RawPool, RawWorkload

        self.series, self.observations = Series, Observations
        self.raw_pool, self.raw_workload = RawPool, RawWorkload
        rng = np.random.default_rng(1)
        n = int((seconds + 2 * WINDOW) / STEP) + 1
        t = np.arange(n) * STEP
        wave = 1 + 0.3 * np.sin(2 * np.pi * t / 3600.0) + rng.normal(0, 0.05, n)
        wave += np.where(rng.random(n) < 0.002, 1.0, 0.0)  # bursts
        wave[rng.random(n) < 0.01] = np.nan
        self.wave = wave
        self.pools, self.workloads = pools, workloads

    def _window(self, i: int, now: float, scale: float) -> Any:
        first = now - WINDOW
        offset = (i * 7919) % int(WINDOW / STEP)
        k = round((first - START) / STEP) + offset
        values = self.wave[k : k + int(WINDOW / STEP) + 1] * scale
        return self.series(first, STEP, values)

    def observe(self, now: float) -> Any:
        pools = tuple(
            self.raw_pool(
                name,
                self._window(i, now, 40.0),
                self._window(i + 1, now, 5.0),
                fragments=2,
                time_slice_level="medium",
                gpu_memory_gib=80.0,
            )
            for i, name in enumerate(self.pools)
        )
        workloads = tuple(
            self.raw_workload(
                key, self._window(i + 3, now, 300.0 + i % 7 * 50), floor=4, replicas=4
            )
            for i, key in enumerate(self.workloads)
        )
        return self.observations(now, pools, workloads)


class NoActuator:
    def apply(self, decisions: object) -> tuple[()]:
        return ()


def records(cfg: Any, seen: int) -> dict[str, Any]:
    """Each workload's floor history as after `seen` earlier ticks (what a controller that
    has run for hours holds: the skill and the reserve score these every tick): the tick
    records as the revision keeps them (a tuple of records, or their array)."""
    from gpuscaler.core.decisions import target_key
    from gpuscaler.core.model import TargetHistory

    as_array = not isinstance(TargetHistory().seen, tuple)
    rng = np.random.default_rng(2)
    out = {}
    for w in cfg.workloads:
        recs = []
        for j in range(seen):
            now = START + WINDOW - (seen - j) * cfg.control.interval
            value = float(300 * rng.gamma(4, 0.25) * (3 if rng.random() < 0.03 else 1))
            upper = value * float(rng.uniform(0.7, 1.5))
            recs.append((now, value, upper, upper / 1.1))
        found: Any = np.asarray(recs, dtype=np.float64).reshape(-1, 4) if as_array else tuple(recs)
        out[target_key("replica_floor", w.key)] = TargetHistory(seen=found)
    return out


def child(gpus: int, ticks: int, seen: int) -> None:
    """Tick in this process; print `snapshot_s plan_s` (CPU seconds of this process:
    other jobs on the machine do not count) for each timed tick."""
    sys.path.insert(0, str(ROOT / "bench"))
    from tick import config

    import gpuscaler.controller as controller_module
    from gpuscaler.controller import Controller

    cfg = config("http://fake:1", gpus, True)
    warm = int(cfg.forecast.min_history / cfg.control.interval) + 2
    seconds = (warm + ticks + 1) * cfg.control.interval
    source = FakeCluster([p.name for p in cfg.node_pools], [w.key for w in cfg.workloads], seconds)
    spent = {"build_snapshot": 0.0, "make_plan": 0.0}

    def timed(name: str) -> Callable[..., Any]:
        inner = getattr(controller_module, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[name] += time.process_time() - t0

        return call

    for name in spent:
        setattr(controller_module, name, timed(name))
    controller = Controller(cfg, source, NoActuator(), dry_run=True, log_decisions=False)
    if seen:
        controller.history = controller.history.updated(records(cfg, seen))
    for k in range(warm + ticks):
        spent.update(build_snapshot=0.0, make_plan=0.0)
        controller.tick(START + WINDOW + cfg.control.interval * k)
        if k >= warm:
            print(f"{spent['build_snapshot']:.6f} {spent['make_plan']:.6f}", flush=True)


def run(pythonpath: str, gpus: int, ticks: int, seen: int) -> tuple[float, float]:
    """Median forecast phase and plan of the code at `pythonpath`, in a child process."""
    env = {**os.environ, "PYTHONPATH": pythonpath}
    cmd = [sys.executable, __file__, "--child", "--gpus", str(gpus), "--ticks", str(ticks)]
    cmd += ["--seen", str(seen)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    rows = [tuple(float(x) for x in line.split()) for line in out.splitlines()]
    return statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--ticks", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seen", type=int, default=0, help="floor records at the start")
    parser.add_argument("--base", default="3b3a100", help="baseline git revision")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.gpus, args.ticks, args.seen)
        return
    with tempfile.TemporaryDirectory() as tmp:
        unpack(args.base, tmp)
        base: list[tuple[float, float]] = []
        branch: list[tuple[float, float]] = []
        for r in range(args.rounds):
            base.append(run(tmp, args.gpus, args.ticks, args.seen))
            branch.append(run(str(ROOT), args.gpus, args.ticks, args.seen))
            print(f"round {r}: base {base[-1]}, branch {branch[-1]} (forecast, plan s)")
    fb, pb = (statistics.median(x[i] for x in base) for i in (0, 1))
    fn, pn = (statistics.median(x[i] for x in branch) for i in (0, 1))
    print(f"load average {os.getloadavg()[0]:.1f}; {args.gpus} GPUs, steady ticks")
    print(
        f"RESULT gpus={args.gpus} seen={args.seen} core_base_s={fb + pb:.4f} core_s={fn + pn:.4f} "
        f"speedup={(fb + pb) / (fn + pn):.2f} forecast_base_s={fb:.4f} forecast_s={fn:.4f} "
        f"plan_base_s={pb:.4f} plan_s={pn:.4f}"
    )


if __name__ == "__main__":
    main()
