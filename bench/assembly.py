"""What the controller's tick spends after the forecast's scoring and around the core, in
the what-if replay's lockstep (issue 20): CPU time a tick of the forecast's assembly
(`assembled`: the chosen paths, intervals, reasons and `Forecast` objects), its interval
check and issue (`resolve_rows`, `issue_rows`), the snapshot outside the forecasts
(`build_snapshot` less `forecast_series`: the stall means, recent peaks, observations)
and the tick outside the core (`Controller.tick` less `build_snapshot` and the plan: the
lanes' observation and record, the listeners, freeing the last tick's objects, the
collector).

bench/lockstep.py's workloads (the bundled week rotated and scaled per workload, 10 s
slots, from day 4 at noon) in `--lanes` lanes for `--hours` (6 h reaches the steady
state: kept errors and skill records full). Each part is timed by wrapping it where it
is called (`time.process_time`, per call). Then the last tick's calls of `assembled`,
`resolve_rows` and `issue_rows` are replayed `--repeat` times on the same arguments
(best of, CPU ms a call: `*_replay_ms`). `digest` is a hash of every lane's decisions
(reasons included) as decisions.jsonl writes them, so a base and this tree can be seen to
decide the same. `--base REV` times another revision (unpacked by `git archive`) and
this tree in child processes, alternated `--rounds` times (medians; the base's keys end
in `_base`).

Last line:
  RESULT lanes=N hours=H tick_ms= assembled_ms= resolve_ms= issue_ms= snapshot_rest_ms=
  tick_rest_ms= forecast_ms= forecast_rest_ms= assembled_replay_ms= resolve_replay_ms=
  issue_replay_ms= digest=
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from lockstep import prepared
from revision import alternated, medians

import gpuscaler.controller as controller_module
import gpuscaler.core.forecast as forecast_module
import gpuscaler.core.snapshot as snapshot_module
from gpuscaler.sim.lockstep import lockstep_runs
from gpuscaler.sim.simulate import RunResult

WRAPPED = (
    (forecast_module, "assembled"),
    (forecast_module, "resolve_rows"),
    (forecast_module, "issue_rows"),
    (forecast_module, "check_rows"),  # resolve_rows' check, from fb8 on (not in the base)
    (forecast_module, "issue_checked"),  # issue_rows from it, from fb8 on
    (forecast_module, "_scoring"),
    (snapshot_module, "forecast_series"),
    (controller_module, "build_snapshot"),
    (controller_module, "make_plan"),
)


REPLAYED = {
    "assembled": ("assembled",),
    "resolve": ("resolve_rows", "check_rows"),
    "issue": ("issue_rows", "issue_checked"),
}
"""The calls replayed, by RESULT key (a revision calls one name of each: fb8 fused the
interval check and issue into `check_rows` and `issue_checked`)."""


def _called(timers: dict[str, Timer], name: str) -> bool:
    return name in timers and timers[name].calls > 0


class Timer:
    """CPU seconds inside `module.name`, summed over calls; the last call's arguments."""

    def __init__(self, module: Any, name: str) -> None:
        self.module, self.name, self.seconds, self.calls = module, name, 0.0, 0
        self.inner: Callable[..., Any] = getattr(module, name)
        self.last: tuple[tuple[Any, ...], dict[str, Any]] = ((), {})

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.process_time()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.seconds += time.process_time() - t0
            self.calls += 1
            self.last = (args, kwargs)

    def replay(self, repeat: int) -> float:
        """Best CPU ms of `repeat` calls with the last call's arguments."""
        args, kwargs = self.last
        best = float("inf")
        for _ in range(repeat):
            t0 = time.process_time()
            self.inner(*args, **kwargs)
            best = min(best, time.process_time() - t0)
        return 1000 * best


def digest(runs: list[RunResult]) -> int:
    """A 48-bit hash of every lane's decisions as decisions.jsonl lines (exact as a float)."""
    h = hashlib.sha256()
    for run in runs:
        for d in run.decisions:
            h.update(json.dumps(d.as_record(), sort_keys=True).encode())
    return int(h.hexdigest()[:12], 16)


def measure(lanes: int, hours: float, repeat: int) -> list[str]:
    preps = prepared(hours, lanes)
    timers = {name: Timer(module, name) for module, name in WRAPPED if hasattr(module, name)}
    ticks = Timer(controller_module.Controller, "tick")
    for timer in timers.values():
        setattr(timer.module, timer.name, timer)
    setattr(controller_module.Controller, "tick", lambda self, now: ticks(self, now))  # noqa: B010
    try:
        runs = lockstep_runs(preps)
        replays = {
            k: sum(timers[name].replay(repeat) for name in names if _called(timers, name))
            for k, names in REPLAYED.items()
        }
    finally:
        for timer in (*timers.values(), ticks):
            setattr(timer.module, timer.name, timer.inner)
    n = ticks.calls

    def ms(seconds: float) -> str:
        return f"{1000 * seconds / n:.3f}"

    s = {k: t.seconds for k, t in timers.items()}
    for name in ("resolve_rows", "issue_rows", "check_rows", "issue_checked"):
        s.setdefault(name, 0.0)
    return [
        f"lanes={lanes}",
        f"hours={hours:g}",
        f"tick_ms={ms(ticks.seconds)}",
        f"snapshot_ms={ms(s['build_snapshot'])}",
        f"plan_ms={ms(s['make_plan'])}",
        f"assembled_ms={ms(s['assembled'])}",
        f"resolve_ms={ms(s['resolve_rows'] + s['check_rows'])}",
        f"issue_ms={ms(s['issue_rows'] + s['issue_checked'])}",
        f"snapshot_rest_ms={ms(s['build_snapshot'] - s['forecast_series'])}",
        f"forecast_ms={ms(s['forecast_series'])}",
        f"forecast_rest_ms={ms(s['forecast_series'] - s['_scoring'])}",
        f"tick_rest_ms={ms(ticks.seconds - s['build_snapshot'] - s['make_plan'])}",
        f"assembled_replay_ms={replays['assembled']:.3f}",
        f"resolve_replay_ms={replays['resolve']:.3f}",
        f"issue_replay_ms={replays['issue']:.3f}",
        f"digest={digest(runs)}",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, default=50)
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--repeat", type=int, default=20, help="replays of the last tick's calls")
    ap.add_argument("--base", help="also time this git revision, alternated")
    ap.add_argument("--rounds", type=int, default=2, help="rounds with --base")
    args = ap.parse_args()
    if args.base:
        cmd = [sys.executable, __file__, "--lanes", str(args.lanes), "--hours", str(args.hours)]
        cmd += ["--repeat", str(args.repeat)]
        out = medians(alternated(args.base, args.rounds, {"base": cmd, "": cmd}))
    else:
        out = measure(args.lanes, args.hours, args.repeat)
    print("RESULT " + " ".join(out))


if __name__ == "__main__":
    main()
