"""Simulator output: a readable table (leading with the equal-cost comparison),
decisions.jsonl and a PNG of the trade-off and the time series."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from gpuscaler.sim.kept import Plotted, plotted
from gpuscaler.sim.simulate import RunResult, SimulationResult

ROWS = (
    ("slo_violation_share", "share of requests waiting > SLO"),
    ("p99_wait_s", "p99 queue wait (s)"),
    ("gpu_hours", "GPU-hours held"),
    ("scaling_actions", "replica count changes"),
    ("direction_reversals", "up/down reversals"),
    ("under_provisioned_share", "share of time demand > ready capacity"),
    ("forecast_mae", "forecast MAE at horizon (% GPU)"),
    ("naive_mae", "last-value MAE at horizon (% GPU)"),
    ("fragment_changes", "fragment changes"),
    ("time_slice_changes", "time slice changes"),
    ("mean_replicas", "mean replicas"),
    ("failed_ticks", "failed ticks"),
)
BASELINE_LABELS = {
    "reactive": "reactive HPA on utilization",
    "keda_rate": "KEDA on request rate",
    "predictive_floor": "predictive floor (FFT + 5 min max)",
}


def equal_cost_lines(summary: dict[str, Any]) -> list[str]:
    g = summary["gpuscaler"]
    lines = [
        f"Equal cost: each baseline swept over targets 40..90 % and read at gpuscaler's "
        f"{g['gpu_hours']:g} GPU-hours; SLO = wait <= {summary['slo_wait_s']:g}s",
        f"{'':<44}{'SLO violations':>16}{'p99 wait (s)':>14}",
        f"{'gpuscaler':<44}{100 * g['slo_violation_share']:>15.3f}%{g['p99_wait_s']:>14.3f}",
    ]
    for name, at in summary.get("equal_cost", {}).items():
        label = BASELINE_LABELS.get(name, name) + " @ equal"
        if at is None:
            why = summary.get("equal_cost_outside", {}).get(name, "outside the curve")
            lines.append(f"{label:<44}  n/a: {why}")
        else:
            lines.append(
                f"{label:<44}{100 * at['slo_violation_share']:>15.3f}%{at['p99_wait_s']:>14.3f}"
            )
    return lines


def table(summary: dict[str, Any]) -> str:
    scored = summary.get("scored_hours", summary["hours"])
    lines = [
        f"trace {summary['trace']}, {summary['hours']:g} h ({scored:g} h scored; the "
        f"forecast from {summary.get('forecast_from_hours', 0):g} h, the floor on observed "
        "demand alone before); GPU load derived from request counts by the simulator's load model "
        "(README)",
        *(equal_cost_lines(summary) if summary.get("baselines") else []),
        "",
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

    fig = plt.figure(figsize=(14, 12))
    grid = fig.add_gridspec(3, 1, height_ratios=(1.1, 1, 1))
    _trade_off(fig.add_subplot(grid[0]), result)
    top = fig.add_subplot(grid[1])
    bottom = fig.add_subplot(grid[2], sharex=top, sharey=top)
    for ax, run in ((top, result.gpuscaler), (bottom, result.reactive)):
        _series(ax, result, run)
    bottom.set_xlabel("hours into trace")
    fig.suptitle(f"{result.trace}: GPU load derived from request counts (load model in the README)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _trade_off(ax: Any, result: SimulationResult) -> None:
    summary = result.summary()
    for name, curve in result.baselines.items():
        pts = sorted(curve, key=lambda p: p["gpu_hours"])
        x = [p["gpu_hours"] for p in pts]
        y = [100 * p["slo_violation_share"] for p in pts]
        ax.plot(x, y, marker="o", ms=3, label=BASELINE_LABELS.get(name, name) + " (40..90 %)")
        for p in pts[:: max(1, len(pts) // 4)]:
            ax.annotate(
                f"{p['target_pct']}", (p["gpu_hours"], 100 * p["slo_violation_share"]), fontsize=6
            )
    g = summary["gpuscaler"]
    ax.plot([g["gpu_hours"]], [100 * g["slo_violation_share"]], "k*", ms=14, label="gpuscaler")
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_xlabel("GPU-hours held")
    ax.set_ylabel(f"% requests waiting > {result.config.simulator.slo_wait:g}s")
    ax.set_title("trade-off: each baseline swept over its target; gpuscaler's point on it")
    ax.legend(loc="upper right", fontsize=8)


def _series(ax: Any, result: SimulationResult, run: RunResult) -> None:
    p = _drawn(result, run)
    ax.plot(p.hours, p.demand, lw=0.6, color="0.45", label="demand (GPUs busy, 1 min mean)")
    ax.plot(p.hours, p.capacity, lw=1.0, color="tab:blue", label="ready capacity (GPUs)")
    if p.late.size:
        ax.plot(
            p.late,
            np.zeros(p.late.size),
            "|",
            color="tab:red",
            ms=10,
            label="requests over the SLO",
        )
    if p.band is not None:
        h = result.config.forecast.horizon
        ax.fill_between(
            *p.band,
            color="tab:orange",
            alpha=0.3,
            label=f"forecast {result.config.forecast.interval_level:.0%} band at +{h:.0f}s",
        )
    for kind, color in (("fragments", "tab:purple"), ("time_slice", "tab:green")):
        times = [t for k, t in p.marks if k == kind]
        for i, t in enumerate(times):
            ax.axvline(t, color=color, lw=0.8, ls="--", label=f"{kind} change" if i == 0 else None)
    pre = [t for k, t in p.marks if k == "preemption"]
    if pre:
        ax.plot(pre, np.zeros(len(pre)), "v", color="black", ms=5, label="preemption step")
    ax.set_title(run.policy)
    ax.set_ylabel("GPUs")
    ax.legend(loc="upper left", fontsize=7)


def _drawn(result: SimulationResult, run: RunResult) -> Plotted:
    """What the PNG draws of `run`: kept when it was released (`simulate.release`)."""
    if run.kept is not None:
        if run.kept.plotted is None:
            raise ValueError(f"{run.policy}'s run was released without its plot")
        return run.kept.plotted
    t, cfg = run.track, result.config
    return plotted(
        run.cluster,
        (t.origin, t.lower, t.upper),
        run.decisions,
        result.start,
        cfg.simulator.slo_wait,
        cfg.forecast.horizon,
    )


def plot(result: SimulationResult, path: Path) -> None:
    """The simulator's PNG of one result (`gpuscaler whatif` writes one per workload)."""
    _plot(result, path)
