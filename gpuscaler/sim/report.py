"""Simulator output: a readable table, decisions.jsonl and a PNG plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from gpuscaler.sim.cluster import SAMPLE
from gpuscaler.sim.simulate import RunResult, SimulationResult

ROWS = (
    ("under_provisioned_share", "share of time demand > ready capacity"),
    ("gpu_hours", "GPU-hours provisioned"),
    ("scaling_actions", "replica count changes"),
    ("direction_reversals", "up/down reversals"),
    ("forecast_mae", "forecast MAE at horizon (% GPU)"),
    ("naive_mae", "last-value MAE at horizon (% GPU)"),
    ("fragment_changes", "fragment changes"),
    ("time_slice_changes", "time slice changes"),
    ("mean_replicas", "mean replicas"),
    ("failed_ticks", "failed ticks"),
)


def table(summary: dict[str, Any]) -> str:
    lines = [
        f"trace {summary['trace']}, {summary['hours']:g} h; GPU utilization derived from "
        "request counts by the simulator's load model (README)",
        f"{'metric':<62}{'gpuscaler':>12}{'reactive':>12}",
    ]
    for key, label in ROWS:
        g, r = summary["gpuscaler"][key], summary["reactive"][key]
        lines.append(f"{label + ' (' + key + ')':<62}{_fmt(g):>12}{_fmt(r):>12}")
    preemption = summary["gpuscaler"].get("preemption")
    if preemption:
        lines.append(
            "preemption: a burst of high-priority pods into a full batch pool (README); the "
            "baseline has no tiers, only the scheduler's one delete"
        )
        for key, value in preemption.items():
            lines.append(f"{'  ' + key:<62}{_fmt(value):>12}{'-':>12}")
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def write_report(result: SimulationResult, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    decisions = directory / "decisions.jsonl"
    with decisions.open("w", encoding="utf-8") as out:
        for d in result.gpuscaler.decisions:
            out.write(json.dumps(d.as_record()) + "\n")
    summary = directory / "summary.json"
    summary.write_text(json.dumps(result.summary(), indent=2) + "\n", encoding="utf-8")
    plot = directory / "simulation.png"
    _plot(result, plot)
    return [decisions, summary, plot]


def _plot(result: SimulationResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(14, 8), sharex=True)
    runs: list[RunResult] = [result.gpuscaler, result.reactive]
    for ax, run in zip(axes, runs, strict=True):
        rec = run.cluster.rec
        n = run.cluster.cursor
        hours = np.arange(n) * SAMPLE / 3600
        stride = 20  # plot 10 s points
        ax.plot(
            hours[::stride],
            rec.demand_busy[:n:stride],
            lw=0.6,
            color="0.45",
            label="demand (GPUs busy)",
        )
        ax.plot(
            hours[::stride],
            rec.capacity[:n:stride],
            lw=1.0,
            color="tab:blue",
            label="ready capacity (GPUs)",
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
        ax.set_title(f"{run.policy}")
        ax.set_ylabel("GPUs")
        ax.legend(loc="upper left", fontsize=8)
    axes[-1].set_xlabel("hours into trace")
    fig.suptitle(f"{result.trace}: simulated GPU load (derived from request counts) vs capacity")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
