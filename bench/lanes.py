"""The simulated clusters of a lockstep's lanes, alone (no controller): CPU time a
lane-tick of what `lockstep_runs` does for them at each tick (advance to the tick, the
HPA's step, the observation the controller reads), one lane after another (`apart`, as
lockstep did before `gpuscaler.sim.lanes`) against all lanes together (`together`:
`LaneClusters`), for N = 10 and 100 lanes by default.

bench/lockstep.py's workloads (the bundled week rotated and scaled per workload, 10 s
slots, from day 4 at noon), without the controller: the floors stay at the configured
minimum, so pods change only with the HPA (fewer changes than under gpuscaler). The
records of both ways are checked equal. `--base REV` also times both ways on another
revision (unpacked by `git archive`, in a child process), alternated `--rounds` times.

Last line:
  RESULT hours=H apart_ms_per_lane_tick_N= together_ms_per_lane_tick_N= speedup_N= ...
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time

import numpy as np
from lockstep import START_HOURS, config, trace
from revision import alternated, medians

from gpuscaler.sim import lockstep
from gpuscaler.sim.replay import workload_config
from gpuscaler.sim.simulate import prepare
from gpuscaler.sim.ticks import control_ticks
from gpuscaler.sim.trace import load_trace


def lanes(n: int, hours: float) -> list[lockstep.Lane]:
    base, cfg = load_trace(), config(n)
    return [
        lockstep.make_lane(
            i, prepare(trace(i, base), hours, 1, workload_config(cfg, w, 10.0), START_HOURS)
        )
        for i, w in enumerate(cfg.workloads)
    ]


def run(n: int, hours: float, together: bool) -> tuple[float, list[lockstep.Lane]]:
    """(CPU ms a lane-tick, the lanes after the run)."""
    ls = lanes(n, hours)
    first = ls[0].cluster
    seconds = len(first.arrivals) * first.slot
    ticks = list(control_ticks(first.start, seconds, first.config.control.interval))
    c0 = time.process_time()
    clusters = lockstep.LockstepClusters(ls)
    if together:
        from gpuscaler.sim.lanes import LaneClusters

        batch = LaneClusters.of([lane.cluster for lane in ls])
        if "batch" in inspect.signature(lockstep.LockstepClusters).parameters:
            clusters = lockstep.LockstepClusters(ls, batch)  # signals read at once (tk8)
    for t in ticks:
        if together:
            batch.advance_to(t)
            batch.hpa_step(t)
        else:
            for lane in ls:
                lane.cluster.advance_to(t)
                lane.cluster.hpa_step(t)
        clusters.observe(t)
    return 1000 * (time.process_time() - c0) / (n * len(ticks)), ls


def measure(sizes: list[int], hours: float, ways: list[str]) -> list[str]:
    out = []
    for n in sizes:
        ms = {}
        for way in ways:
            ms[way], ls = run(n, hours, way == "together")
            out.append(f"{way}_ms_per_lane_tick_{n}={ms[way]:.4f}")
            if len(ways) == 2 and way == "apart":
                kept = ls
        if len(ways) == 2:
            for a, b in zip(kept, ls, strict=True):
                for name in ("served", "gpus", "capacity", "demand_busy", "replicas", "requests"):
                    x, y = getattr(a.cluster.rec, name), getattr(b.cluster.rec, name)
                    if not np.array_equal(x, y, equal_nan=True):
                        raise SystemExit(f"lane {a.workload.key}: {name} differs")
            out.append(f"speedup_{n}={ms['apart'] / ms['together']:.2f}")
    return out


def against_base(args: argparse.Namespace) -> list[str]:
    cmd = [sys.executable, __file__, "--sizes", args.sizes, "--hours", str(args.hours)]
    rows = alternated(
        args.base,
        args.rounds,
        {"base": [*cmd, "--ways", "apart,together"], "": [*cmd, "--ways", "apart,together"]},
    )
    return medians(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,100", help="lanes")
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--ways", default="apart,together")
    ap.add_argument("--base", help="also time `apart` on this git revision, alternated")
    ap.add_argument("--rounds", type=int, default=2, help="rounds with --base")
    args = ap.parse_args()
    if args.base:
        out = against_base(args)
    else:
        sizes = [int(x) for x in args.sizes.split(",")]
        out = [f"hours={args.hours:g}", *measure(sizes, args.hours, args.ways.split(","))]
    print("RESULT " + " ".join(out))


if __name__ == "__main__":
    main()
