"""The baselines' sweep against the per-run code it replaces, in the same run.

Replays `--hours` of a trace (the bundled one by default; `synthetic:<family>` for a
synthetic family) at `--slot` and runs the 33 baseline points (3 scalers x 11 targets)
twice: one `SimulatedCluster` per point as before (`tests/per_run_baselines.py`), and all
at once (`simulate.run_baselines`, `gpuscaler.sim.sweep`). Checks the curves are equal,
prints the CPU seconds of each and their ratio.

Last line: RESULT trace= hours= slot= runs= per_run_s= sweep_s= speedup= one_run_s=
sweep_in_runs= equal=  (one_run_s: the per-run code's time for one point; sweep_in_runs:
the sweep's time in those units, so 1.0 means all 33 points cost what one did.)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from per_run_baselines import per_run_baselines

from gpuscaler.config import Config
from gpuscaler.sim.cluster import arrivals_from_trace
from gpuscaler.sim.simulate import run_baselines, scenario_config
from gpuscaler.sim.synthetic import synthetic_trace
from gpuscaler.sim.trace import Trace, load_trace


def _trace(source: str, hours: float, start: float) -> Trace:
    if source.startswith("synthetic:"):
        return synthetic_trace(source.split(":", 1)[1], hours=start + hours, seed=7)
    return load_trace(None if source == "bundled" else source)


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.process_time()
    out = fn()
    return out, time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="bundled", help="a CSV path, bundled or synthetic:NAME")
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--start", type=float, default=0.0, help="hour of the trace to start at")
    ap.add_argument("--slot", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    trace = _trace(args.trace, args.hours, args.start)
    base = Config()
    config = scenario_config(
        base.model_copy(update={"simulator": base.simulator.model_copy(update={"slot": args.slot})})
    )
    start, seconds = trace.start + args.start * 3600, args.hours * 3600
    arrivals = arrivals_from_trace(trace, start, seconds, args.seed, args.slot)
    scored = int(config.metrics.window / args.slot)
    replay = (config, start, seconds, arrivals, args.seed, scored)
    sweep, sweep_s = _timed(lambda: run_baselines(*replay))
    per_run, per_run_s = _timed(lambda: per_run_baselines(*replay))
    runs = sum(len(curve) for curve in per_run.values())
    one = per_run_s / runs
    print(f"per-run: {per_run_s:.2f} CPU-s for {runs} runs ({one:.3f} s each)")
    print(f"sweep:   {sweep_s:.2f} CPU-s for all of them")
    print(
        f"RESULT trace={trace.name} hours={args.hours:g} slot={args.slot:g} runs={runs} "
        f"per_run_s={per_run_s:.2f} sweep_s={sweep_s:.2f} speedup={per_run_s / sweep_s:.1f} "
        f"one_run_s={one:.3f} sweep_in_runs={sweep_s / one:.2f} "
        f"equal={'true' if sweep == per_run else 'false'}"
    )


if __name__ == "__main__":
    main()
