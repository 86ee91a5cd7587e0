"""The replica floors' own work a tick of a lockstep (issue 20): `plan._replica_floors`
less what other parts own there (the skills, the reserves, the remembered records).

N workloads (bench/lockstep.py's: the bundled week rotated and scaled, 10 s slots, from
day 4 at noon) run in lockstep for `--hours`. Timed in CPU seconds: the floors' own work
summed over the run's ticks, then the last tick's again, alone, `--repeat` times (its
minimum and median: the steady state, at full history). `digest`: a hash of every tick's
decisions and skips (their reasons read after the timing) and the last tick's histories,
so a base and this tree can be checked equal. `--base REV` runs REV's code
(bench/revision.py) and this tree in child processes, alternated `--rounds` times; the
base's keys end in `_base` (medians of the rounds).

Last line:
  RESULT hours=H floors_us_per_lane_N= last_floors_us_min_N= last_floors_us_median_N=
  digest_N= ...
"""

from __future__ import annotations

import hashlib
import statistics
import sys
from typing import Any

from lockstep import prepared
from planrows import CpuTimer, run

import gpuscaler.controller as controller_module
import gpuscaler.core.plan as plan_module
from gpuscaler.sim import lockstep as lockstep_module

OTHERS = ("_skills", "_reserves", "_remembered")
"""`plan`'s functions inside the floors that are not timed here (another part's)."""


def measure(n: int, hours: float, repeat: int) -> list[str]:
    """This process' figures for a lockstep of `n` workloads."""
    preps = prepared(hours, n)
    floors = CpuTimer(plan_module._replica_floors)
    others = {name: CpuTimer(getattr(plan_module, name)) for name in OTHERS}
    inner = getattr(controller_module, "make_plan")  # noqa: B009 (not exported)
    plans: list[Any] = []
    last: list[tuple[Any, ...]] = []

    def planned(*args: Any) -> Any:
        last[:] = [args]
        plans.append(inner(*args))
        return plans[-1]

    def run_floors() -> float:
        """CPU seconds of one plan's floors less the others', by the timers."""
        before = floors.seconds - sum(t.seconds for t in others.values())
        plan_module.plan(*last[0])
        return floors.seconds - sum(t.seconds for t in others.values()) - before

    setattr(controller_module, "make_plan", planned)  # noqa: B010 (not exported)
    plan_module._replica_floors = floors
    for name, timer in others.items():
        setattr(plan_module, name, timer)
    try:
        runs = lockstep_module.lockstep_runs(preps)
        if any(r.failed_ticks for r in runs) or not plans:
            raise SystemExit("the lockstep's ticks failed")
        own = floors.seconds - sum(t.seconds for t in others.values())
        alone = [1e6 * run_floors() / n for _ in range(repeat)]
    finally:
        setattr(controller_module, "make_plan", inner)  # noqa: B010
        plan_module._replica_floors = floors.inner
        for name, timer in others.items():
            setattr(plan_module, name, timer.inner)
    digest = hashlib.sha256()
    for p in plans:
        digest.update(repr((p.decisions, p.skips)).encode())
    digest.update(repr(sorted(plans[-1].history.targets.items())).encode())
    per_lane = 1e6 * own / len(plans) / n
    print(
        f"{n} lanes x {len(plans)} ticks: floors {per_lane:.2f} us a lane-tick; the last "
        f"tick's {min(alone):.2f} (min of {repeat}); digest {digest.hexdigest()[:16]}",
        file=sys.stderr,
    )
    return [
        f"floors_us_per_lane_{n}={per_lane:.2f}",
        f"last_floors_us_min_{n}={min(alone):.2f}",
        f"last_floors_us_median_{n}={statistics.median(alone):.2f}",
        f"digest_{n}={int(digest.hexdigest()[:4], 16)}",
    ]


def main() -> None:
    run(__doc__ or "", __file__, measure, "10,50")


if __name__ == "__main__":
    main()
