"""Many workloads' baseline sweeps as one against one sweep a workload, in the same run.

What `gpuscaler whatif` does with a chunk of workloads after their lockstep: it sweeps
the 33 baseline points (3 scalers x 11 targets) of every workload. Before, one sweep a
workload (`simulate.run_baselines`); now the workloads that share a model in one sweep
(`replay.swept_many`, `gpuscaler.sim.baselines`). The workloads are bench/whatif.py's:
the bundled week rotated and scaled per workload, `--hours` of it at `--slot` (10 s, as
whatif replays). Checks every workload's curves are equal, prints CPU seconds.

Last line: RESULT workloads= hours= slot= one_by_one_s= together_s= speedup=
per_workload_one_by_one_s= per_workload_together_s= equal=

`--around`: all the runs around gpuscaler's (`gpuscaler.sim.around`): each workload's
reactive HPA run (`simulate.reactive_run`), the run of the replicas that ran
(`around.actual_run`, on bench/whatif.py's replica series: read every 60 s) and its own
sweep, one after the other, against all of them in one sweep (`around.around_many`, as
whatif runs them now); checks the curves, the actual figures and the reactive run's whole
record equal (RESULT ... around=true).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from whatif import REPLICA_STEP, STEP, config_text, demand

from gpuscaler.config import parse_config
from gpuscaler.core.model import Series
from gpuscaler.sim.around import actual_run, around_many, swept_many
from gpuscaler.sim.cluster import RECORDED, arrivals_from_trace
from gpuscaler.sim.replay import workload_config
from gpuscaler.sim.simulate import Prepared, baseline_curves, reactive_run
from gpuscaler.sim.trace import Trace, load_trace


def replays(workloads: int, hours: float, slot: float) -> list[Prepared]:
    """Each workload's replay as whatif prepares it (its own config, one range and seed)."""
    config = parse_config(config_text("http://unused", workloads))
    base = np.nan_to_num(load_trace().counts / STEP)
    seconds = hours * 3600
    points = round(seconds / STEP) + 1
    out = []
    for i, w in enumerate(config.workloads):
        cfg = workload_config(config, w, slot)
        rate = demand(i, np.resize(base, max(points, len(base))), points)
        trace = Trace(w.key, 0.0, STEP, rate * STEP, "bench")
        arrivals = arrivals_from_trace(trace, 0.0, seconds, 1, slot)
        scored = int(cfg.metrics.window / slot)
        out.append(Prepared(w.key, cfg, 0.0, seconds, arrivals, 1, scored, 0.0))
    return out


def schedules(ps: list[Prepared]) -> list[Series]:
    """Each workload's replicas that ran, as bench/whatif.py backfills them (60 s)."""
    every = round(REPLICA_STEP / STEP)
    base = np.nan_to_num(load_trace().counts / STEP)
    out = []
    for i, p in enumerate(ps):
        points = round(p.seconds / STEP) + 1
        rate = demand(i, np.resize(base, max(points, len(base))), points)
        counts = np.maximum(1, np.ceil(rate * 0.06 * 100 / 35))[::every]
        out.append(Series(p.start, REPLICA_STEP, np.asarray(counts, dtype=np.float64)))
    return out


def around(ps: list[Prepared]) -> tuple[float, float, bool]:
    """(CPU seconds apart, in one sweep, whether every figure and record is equal)."""
    reps = schedules(ps)
    t0 = time.process_time()
    together = around_many(ps, reps)
    together_s = time.process_time() - t0
    t0 = time.process_time()
    apart = [
        (
            reactive_run(p),
            actual_run(p.config, s, p.arrivals, p.start, p.seconds, p.seed, p.scored_from),
            baseline_curves(p),
        )
        for p, s in zip(ps, reps, strict=True)
    ]
    apart_s = time.process_time() - t0
    equal = True
    for (reactive, actual, curves), a in zip(apart, together, strict=True):
        assert a.reactive is not None
        got, want = a.reactive.cluster, reactive.cluster
        equal &= a.curves == curves and a.actual == actual
        equal &= got.replica_changes == want.replica_changes and got.cursor == want.cursor
        for name in set(RECORDED) - {"queue", "load", "pool_util", "stall"}:  # not kept
            x, y = getattr(got.rec, name), getattr(want.rec, name)
            equal &= bool(np.array_equal(x, y, equal_nan=True))
    return apart_s, together_s, equal


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", type=int, default=8)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--slot", type=float, default=10.0)
    ap.add_argument("--around", action="store_true", help="the reactive and actual runs too")
    args = ap.parse_args()
    ps = replays(args.workloads, args.hours, args.slot)
    n = args.workloads
    if args.around:
        apart_s, together_s, same = around(ps)
        print(
            f"RESULT around workloads={n} hours={args.hours:g} slot={args.slot:g} "
            f"apart_s={apart_s:.2f} together_s={together_s:.2f} "
            f"speedup={apart_s / together_s:.2f} per_workload_apart_s={apart_s / n:.2f} "
            f"per_workload_together_s={together_s / n:.2f} around={'true' if same else 'false'}"
        )
        return
    t0 = time.process_time()
    together = swept_many(ps)
    together_s = time.process_time() - t0
    t0 = time.process_time()
    alone = [baseline_curves(p) for p in ps]
    alone_s = time.process_time() - t0
    print(f"one sweep a workload: {alone_s:.2f} CPU-s; all as one: {together_s:.2f} CPU-s")
    print(
        f"RESULT workloads={n} hours={args.hours:g} slot={args.slot:g} "
        f"one_by_one_s={alone_s:.2f} together_s={together_s:.2f} "
        f"speedup={alone_s / together_s:.2f} per_workload_one_by_one_s={alone_s / n:.2f} "
        f"per_workload_together_s={together_s / n:.2f} "
        f"equal={'true' if together == alone else 'false'}"
    )


if __name__ == "__main__":
    main()
