"""The planner's work outside the skills and the lanes' observations, a tick of a lockstep
(issue 20): what stays per lane once the forecasts and skills are taken over rows.

N workloads (bench/lockstep.py's: the bundled week rotated and scaled, 10 s slots, from
day 4 at noon) run in lockstep for `--hours`. Timed in CPU seconds, per tick: the plan
(`core.plan.plan`) less its skills (`plan._skills`, another helper's), and
`LockstepClusters.observe` (every lane's pool and workload signals), summed over the
run's ticks; then the last tick's plan again, alone, `--repeat` times (its minimum and
median: the steady state, at full history). `--base REV` runs REV's code (bench/revision.py)
and this tree in child processes, alternated `--rounds` times; the base's keys end in
`_base` (medians of the rounds).

Last line:
  RESULT hours=H rest_ms_per_tick_N= observe_ms_per_tick_N= last_rest_ms_min_N=
  last_rest_ms_median_N= rest_us_per_lane_N= observe_us_per_lane_N= ...
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from lockstep import prepared
from revision import alternated, medians

import gpuscaler.controller as controller_module
import gpuscaler.core.plan as plan_module
from gpuscaler.sim import lockstep as lockstep_module


class CpuTimer:
    """CPU seconds inside `inner`, summed over calls."""

    def __init__(self, inner: Callable[..., Any]) -> None:
        self.inner, self.seconds, self.calls = inner, 0.0, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        c0 = time.process_time()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.seconds += time.process_time() - c0
            self.calls += 1


def measure(n: int, hours: float, repeat: int) -> list[str]:
    """This process' figures for a lockstep of `n` workloads."""
    preps = prepared(hours, n)
    plan, skills = CpuTimer(plan_module.plan), CpuTimer(plan_module._skills)
    observe = CpuTimer(lockstep_module.LockstepClusters.observe)
    last: list[tuple[Any, ...]] = []

    def planned(*args: Any) -> Any:
        last[:] = [args]
        return plan(*args)

    def observed(self: Any, now: float) -> Any:
        return observe(self, now)

    setattr(controller_module, "make_plan", planned)  # noqa: B010 (not exported)
    plan_module._skills = skills
    lockstep_module.LockstepClusters.observe = observed  # type: ignore[method-assign]
    try:
        runs = lockstep_module.lockstep_runs(preps)
        if any(r.failed_ticks for r in runs) or not plan.calls:
            raise SystemExit("the lockstep's ticks failed")
        ticks = plan.calls
        rest = 1000 * (plan.seconds - skills.seconds) / ticks
        seen = 1000 * observe.seconds / observe.calls
        alone = []
        for _ in range(repeat):
            skills.seconds, c0 = 0.0, time.process_time()
            plan.inner(*last[0])
            alone.append(1000 * (time.process_time() - c0 - skills.seconds))
    finally:
        setattr(controller_module, "make_plan", plan.inner)  # noqa: B010
        plan_module._skills = skills.inner
        lockstep_module.LockstepClusters.observe = observe.inner  # type: ignore[method-assign]
    print(
        f"{n} lanes x {ticks} ticks: plan less skills {rest:.2f} ms a tick, observe "
        f"{seen:.2f} ms; the last tick's plan less skills {min(alone):.2f} ms (min of "
        f"{repeat})",
        file=sys.stderr,
    )
    return [
        f"rest_ms_per_tick_{n}={rest:.3f}",
        f"observe_ms_per_tick_{n}={seen:.3f}",
        f"last_rest_ms_min_{n}={min(alone):.3f}",
        f"last_rest_ms_median_{n}={statistics.median(alone):.3f}",
        f"rest_us_per_lane_{n}={1000 * rest / n:.2f}",
        f"observe_us_per_lane_{n}={1000 * seen / n:.2f}",
    ]


def run(doc: str, script: str, measure: Callable[[int, float, int], list[str]], sizes: str) -> None:
    """The main of a script that times the last tick's plan again at each lockstep size
    (`measure(n, hours, repeat)`), alone or alternated with --base; prints its RESULT."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--sizes", default=sizes, help="workloads in lockstep")
    ap.add_argument("--hours", type=float, default=3.0)
    ap.add_argument("--repeat", type=int, default=30, help="the last tick's plan, again")
    ap.add_argument("--base", help="also time this git revision, alternated")
    ap.add_argument("--rounds", type=int, default=2, help="rounds with --base")
    args = ap.parse_args()
    if args.base:
        cmd = [sys.executable, script, "--sizes", args.sizes, "--hours", str(args.hours)]
        cmd += ["--repeat", str(args.repeat)]
        out = medians(alternated(args.base, args.rounds, {"base": cmd, "": cmd}))
    else:
        out = [f"hours={args.hours:g}"]
        for n in (int(x) for x in args.sizes.split(",")):
            out += measure(n, args.hours, args.repeat)
    print("RESULT " + " ".join(out))


def main() -> None:
    run(__doc__ or "", __file__, measure, "19,100")


if __name__ == "__main__":
    main()
