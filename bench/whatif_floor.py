"""What issue 20's gate costs at the least with whatif's present design: the lockstep's
fixed cost a tick and the sweep around it, measured, with the lanes' own work taken as
nothing (a floor no cut of the per-lane work can go under).

whatif replays 100 workload-weeks (bench/whatif.py) as chunks of `--lanes` workloads a
lockstep (one controller ticks every lane of a chunk: 20,160 ticks a week at 30 s), the
chunks shared by `--cores` worker processes, each chunk then sweeping the runs around its
lanes (the baselines over their targets, the reactive HPA). So its CPU time is about

    chunks x ticks x fixed  +  workloads x ticks x lane  +  workloads x sweep

where `fixed` is a lockstep tick's cost whatever its lanes, `lane` what each lane adds to
it, and `sweep` a workload-week's sweep. Measured here, in this process, CPU seconds:
- `fixed` and `lane`: `lockstep_runs` of bench/lockstep.py's workloads (the bundled week
  rotated and scaled, 10 s slots, from day 4 at noon) for `--hours` at `--small` and
  `--lanes` lanes: the line through the two (`fixed` its intercept, `lane` its slope);
- `sweep`: `around.around_many` of `--lanes` of those workloads over `--sweep-hours` (72:
  the bundled week from day 4 at noon holds 84 h; scaled to a week: its groups, sized by
  its slots, are as many as a week's, each stepping fewer ticks) with
  the group budget a chunk of them gets in whatif (`replay.freed`), baselines and
  reactive runs (not the replicas that ran, which whatif adds: a floor).
The history reads and the reports are left out (more floor).

Last line: RESULT fixed_ms_per_tick= lane_ms_per_tick= sweep_s_per_workload_week=
floor_s= (the whole on `--cores` cores with `lane` = 0) projected_s= (with `lane`)
gate_s=120 floor_over_gate= (floor_s / gate_s: above 1, no cut of the lanes' work alone
meets the gate)
"""

from __future__ import annotations

import argparse
import math
import time

from lockstep import prepared

from gpuscaler.sim.around import MANY_BYTES, around_many
from gpuscaler.sim.lockstep import lockstep_runs
from gpuscaler.sim.replay import freed
from gpuscaler.sim.simulate import Prepared

GATE_S = 120.0
"""Issue 20's gate: 100 workload-weeks in at most 120 s on this (2-core) machine."""
WEEK_TICKS = 7 * 86400 // 30
"""A week's control ticks at the default 30 s interval."""


def lockstep_cpu(lanes: int, hours: float) -> float:
    """CPU seconds of one lockstep of `lanes` workloads over `hours`."""
    preps = prepared(hours, lanes)
    t0 = time.process_time()
    lockstep_runs(preps)
    return time.process_time() - t0


def sweep_cpu(lanes: int, hours: float) -> float:
    """CPU seconds of the sweep around a chunk of `lanes` workloads over `hours`, grouped
    as whatif groups it (its budget: what the chunk's lanes held)."""
    preps = prepared(hours, lanes)
    t0 = time.process_time()
    sweep_around(preps)
    return time.process_time() - t0


def sweep_around(preps: list[Prepared]) -> None:
    """The sweep around the workloads `preps` as whatif groups it: its group budget what
    their lanes held (`replay.freed`), its runs not released (nothing to release here)."""
    around_many(preps, None, budget=max(MANY_BYTES, freed(preps)), released=False)


def options(description: str) -> argparse.ArgumentParser:
    """The options of this floor (and of bench/whatif_numeric.py and whatif_given.py): the
    gate's workloads, the chunk's lanes, the two locksteps and the sweep measured, the
    cores."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--workloads", type=int, default=100)
    ap.add_argument("--lanes", type=int, default=50, help="whatif's lanes a chunk (its default)")
    ap.add_argument("--small", type=int, default=5, help="the fewer lanes of the line")
    ap.add_argument("--hours", type=float, default=6.0, help="the locksteps' replay")
    ap.add_argument("--sweep-hours", type=float, default=72.0, help="scaled to a week")
    ap.add_argument("--cores", type=int, default=2)
    return ap


def line(small: float, big: float, args: argparse.Namespace) -> tuple[float, float]:
    """(fixed, lane): CPU seconds a tick whatever its lanes and a lane-tick, the line
    through a lockstep's CPU seconds at `args.small` (`small`) and `args.lanes` (`big`)
    lanes over `args.hours`."""
    ticks = args.hours * 3600 / 30
    lane = (big - small) / (args.lanes - args.small) / ticks
    return small / ticks - args.small * lane, lane


def a_workload_week(sweep: float, args: argparse.Namespace) -> float:
    """CPU seconds a workload-week of the sweep's `sweep` around `args.lanes` workloads over
    `args.sweep_hours`."""
    lanes: int = args.lanes
    hours: float = args.sweep_hours
    return sweep / lanes * 168.0 / hours


def gate_seconds(fixed: float, lane: float, sweep: float, args: argparse.Namespace) -> float:
    """The gate's whole on `args.cores` cores from a tick's `fixed`, a lane-tick's `lane`
    and a workload-week's `sweep` CPU seconds (chunks of `args.lanes` workloads)."""
    workloads: int = args.workloads
    lanes: int = args.lanes
    cores: int = args.cores
    chunks = math.ceil(workloads / lanes)
    cpu = chunks * WEEK_TICKS * fixed + workloads * (WEEK_TICKS * lane + sweep)
    return cpu / cores


def main() -> None:
    args = options(__doc__.splitlines()[0]).parse_args()
    small, big = (lockstep_cpu(n, args.hours) for n in (args.small, args.lanes))
    fixed, lane = line(small, big, args)
    sweep = a_workload_week(sweep_cpu(args.lanes, args.sweep_hours), args)
    floor = gate_seconds(fixed, 0.0, sweep, args)
    projected = gate_seconds(fixed, lane, sweep, args)
    print(
        f"lockstep over {args.hours:g} h: {args.small} lanes {small:.1f} CPU-s, "
        f"{args.lanes} lanes {big:.1f} CPU-s; the sweep around {args.lanes} lanes over "
        f"{args.sweep_hours:g} h: {sweep * args.lanes * args.sweep_hours / 168.0:.1f} CPU-s"
    )
    print(
        f"RESULT fixed_ms_per_tick={fixed * 1e3:.2f} lane_ms_per_tick={lane * 1e3:.3f} "
        f"sweep_s_per_workload_week={sweep:.2f} floor_s={floor:.0f} projected_s={projected:.0f} "
        f"gate_s={GATE_S:g} floor_over_gate={floor / GATE_S:.2f}"
    )


if __name__ == "__main__":
    main()
