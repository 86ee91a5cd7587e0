"""Many workloads' baseline sweeps as one against one sweep a workload, in the same run.

What `gpuscaler whatif` does with a chunk of workloads after their lockstep: it sweeps
the 33 baseline points (3 scalers x 11 targets) of every workload. Before, one sweep a
workload (`simulate.run_baselines`); now the workloads that share a model in one sweep
(`replay.swept_many`, `gpuscaler.sim.baselines`). The workloads are bench/whatif.py's:
the bundled week rotated and scaled per workload, `--hours` of it at `--slot` (10 s, as
whatif replays). Checks every workload's curves are equal, prints CPU seconds.

Last line: RESULT workloads= hours= slot= one_by_one_s= together_s= speedup=
per_workload_one_by_one_s= per_workload_together_s= equal=
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from whatif import STEP, config_text, demand

from gpuscaler.config import parse_config
from gpuscaler.sim.cluster import arrivals_from_trace
from gpuscaler.sim.replay import swept_many, workload_config
from gpuscaler.sim.simulate import Prepared, baseline_curves
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", type=int, default=8)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--slot", type=float, default=10.0)
    args = ap.parse_args()
    ps = replays(args.workloads, args.hours, args.slot)
    t0 = time.process_time()
    together = swept_many(ps)
    together_s = time.process_time() - t0
    t0 = time.process_time()
    alone = [baseline_curves(p) for p in ps]
    alone_s = time.process_time() - t0
    n = args.workloads
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
