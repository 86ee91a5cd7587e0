"""A steady controller tick at N GPUs split phase by phase, Python only (issue 18).

bench/tick.py's config (N/100 pools by modelName, N/10 workloads) read by the grouped
reader (`GroupedPrometheusSource`), whose queries are answered by fakes built beforehand
instead of a Prometheus: each answer holds every pool or workload with the new points
as orjson and numpy would hand them over (`fast.decode_fast`'s `arrays`), about 1 % NaN.
So what is timed is the Python between Prometheus and the core and the core itself:
- `prefetch`: planning the grouped queries and cutting their answers per target;
- `windows`: the per-target reads into the windows (`PrometheusMetrics.read` answered from
  memory) and the join with the cluster state;
- `forecast`: `build_snapshot`; `plan`: `make_plan`.
A first tick reads forecast.min_history and its background backfill the rest; then
`--ticks` steady ticks 30 s apart. `--profile` prints cProfile's top functions of the last
tick. Run it niced: `nice -n 10 .venv/bin/python bench/tickphases.py --gpus 10000`.

Last line: RESULT tick_s= prefetch_s= windows_s= forecast_s= plan_s= (medians over the
steady ticks after the first).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tick import PHASES, SPENT, NoActuator, Timed, config, phases_of_tick, time_phases

from gpuscaler.adapters.kube.objects import CurrentState
from gpuscaler.adapters.prometheus.grouped import GroupedPrometheusMetrics
from gpuscaler.adapters.prometheus.memo import INSTANT, Chunk
from gpuscaler.adapters.prometheus.transport import SourceError
from gpuscaler.controller import Controller
from gpuscaler.sources import GroupedPrometheusSource

START = 1_800_000_000.0
SHOWN = PHASES[2:]
"""No HTTP here: the requests and decoding are not part of this harness."""


class FakeAnswers:
    """A grouped query's answer: every pool (or workload) of the config, new points each."""

    def __init__(self, gpus: int, seed: int = 1):
        self.rng = np.random.default_rng(seed)
        self.pools = [{"modelName": f"pool-{p}"} for p in range(gpus // 100)]
        self.workloads = [{"namespace": f"w{w}", "workload": f"w{w}"} for w in range(gpus // 10)]

    def __call__(self, query: str, chunk: Chunk, step: float) -> list[Any]:
        labels = self.workloads if "workload" in query else self.pools
        if chunk[1] == INSTANT:
            return [{"metric": m, "value": [chunk[0], "30000"]} for m in labels]
        t = np.arange(chunk[0], chunk[1] + 1e-9, step)
        scale = 1000.0 if "workload" in query else 40.0
        out = []
        for m in labels:
            v = scale * (1 + 0.2 * np.sin(t / 300.0)) + self.rng.normal(0, 1, t.size)
            v[self.rng.random(t.size) < 0.01] = np.nan
            out.append({"metric": m, "values": [], "arrays": (t, v)})
        return out


def build(gpus: int) -> Controller:
    fake = FakeAnswers(gpus)
    cfg = config("http://fake:1", gpus, True, rules=False)
    source = GroupedPrometheusSource(cfg, CurrentState())
    metrics = source.grouped
    step = cfg.metrics.step

    def answer(query: str, chunk: Chunk, counted: bool = True) -> list[Any] | SourceError:
        return fake(query, chunk, step)

    metrics._query = answer  # type: ignore[method-assign]
    metrics.prefetch = Timed(SPENT, "prefetch", metrics.prefetch)  # type: ignore[method-assign]
    source.observe = Timed(SPENT, "observe", source.observe)  # type: ignore[method-assign]
    return Controller(cfg, source, NoActuator(), dry_run=True, log_decisions=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--ticks", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    time_phases()
    controller = build(args.gpus)
    assert isinstance(controller.source, GroupedPrometheusSource)
    assert isinstance(controller.source.grouped, GroupedPrometheusMetrics)
    began = time.perf_counter()
    controller.tick(START)
    assert controller.source.grouped.backfill.wait(timeout=600)
    print(f"[{args.gpus}] first tick {time.perf_counter() - began:.2f}s", flush=True)
    rows: list[dict[str, float]] = []
    for k in range(1, args.ticks + 1):
        profile = cProfile.Profile() if args.profile and k == args.ticks else None
        if profile is not None:
            profile.enable()
        row = phases_of_tick(controller, START + 30 * k)
        if profile is not None:
            profile.disable()
        rows.append(row)
        print(
            f"[{args.gpus}] tick {k}: "
            + " ".join(f"{n} {row[n]:.3f}" for n in ("tick", *SHOWN))
            + f" (queries {controller.source.queries_last_tick})",
            flush=True,
        )
        if profile is not None:
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    keep = rows[1:] or rows
    median = {n: statistics.median(r[n] for r in keep) for n in ("tick", *SHOWN)}
    print(f"load average {os.getloadavg()[0]:.1f}; {args.gpus} GPUs, steady ticks")
    print("RESULT " + " ".join(f"{n}_s={median[n]:.4f}" for n in ("tick", *SHOWN)))


if __name__ == "__main__":
    main()
