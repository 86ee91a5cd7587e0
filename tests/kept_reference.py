"""The PNG's series of one run as `gpuscaler.sim.report` drew them from the whole record
before runs were released (`simulate.release`): the oracle of tests/test_kept.py."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuscaler.sim.queue import fluid_waits
from gpuscaler.sim.simulate import RunResult, SimulationResult


def _series(ax: Any, result: SimulationResult, run: RunResult) -> None:
    rec = run.cluster.rec
    n = run.cluster.cursor
    slot = run.cluster.slot
    per = max(1, round(60 / slot))  # 1 minute means: readable over a day
    m = n // per * per
    hours = (np.arange(m // per) + 1) * per * slot / 3600
    demand = rec.demand_busy[:m].reshape(-1, per).mean(axis=1)
    capacity = rec.capacity[:m].reshape(-1, per).mean(axis=1)
    ax.plot(hours, demand, lw=0.6, color="0.45", label="demand (GPUs busy, 1 min mean)")
    ax.plot(hours, capacity, lw=1.0, color="tab:blue", label="ready capacity (GPUs)")
    waits = fluid_waits(run.cluster.work[:n], rec.served[:n], slot)
    late = np.flatnonzero((waits > result.config.simulator.slo_wait) & (rec.requests[:n] > 0))
    if late.size:
        ax.plot(
            late * slot / 3600,
            np.zeros(late.size),
            "|",
            color="tab:red",
            ms=10,
            label="requests over the SLO",
        )
    if run.track.origin:
        h = result.config.forecast.horizon
        fx = (np.asarray(run.track.origin) + h - result.start) / 3600
        ax.fill_between(
            fx,
            np.asarray(run.track.lower) / 100,
            np.asarray(run.track.upper) / 100,
            color="tab:orange",
            alpha=0.3,
            label=f"forecast {result.config.forecast.interval_level:.0%} band at +{h:.0f}s",
        )
    for kind, color in (("fragments", "tab:purple"), ("time_slice", "tab:green")):
        times = [(d.time - result.start) / 3600 for d in run.decisions if d.kind == kind]
        for i, t in enumerate(times):
            ax.axvline(t, color=color, lw=0.8, ls="--", label=f"{kind} change" if i == 0 else None)
    pre = [(d.time - result.start) / 3600 for d in run.decisions if d.kind == "preemption"]
    if pre:
        ax.plot(pre, np.zeros(len(pre)), "v", color="black", ms=5, label="preemption step")
    ax.set_title(run.policy)
    ax.set_ylabel("GPUs")
    ax.legend(loc="upper left", fontsize=7)
