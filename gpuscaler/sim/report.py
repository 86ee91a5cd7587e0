"""Simulator output: a readable table (leading with the equal-cost comparison),
decisions.jsonl and a PNG of the trade-off and the time series."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from gpuscaler.sim.equal_cost import hours_at_share
from gpuscaler.sim.records import RunResult, SimulationResult

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
    "dynamo_sla": "Dynamo-style SLA planner (Kalman)",
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
    needed = hours_at_share(
        summary.get("baselines", {}).get("reactive", []), g["slo_violation_share"]
    )
    if needed is not None:
        hours, edge = needed
        at_most = " at most (its cheapest point already does)" if edge else ""
        lines.append(
            f"Equal SLO: the reactive HPA needs {hours:.4g} GPU-hours{at_most} to violate no "
            f"more than gpuscaler: saved {100 * (1 - g['gpu_hours'] / hours):.1f}% "
            "(negative: gpuscaler holds more)"
        )
    return lines


def table(summary: dict[str, Any]) -> str:
    scored = summary.get("scored_hours", summary["hours"])
    lines = [
        f"trace {summary['trace']}, {summary['hours']:g} h ({scored:g} h scored; the "
        f"forecast from {summary.get('forecast_from_hours', 0):g} h, the floor on observed "
        "demand alone before); GPU load derived from request counts by the simulator's load model "
        "(docs/evaluation.md)",
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
            "preemption: a burst of high-priority pods into a full batch pool "
            "(docs/preemption.md); the baseline has no tiers, only the scheduler's one delete"
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
    png = directory / "simulation.png"
    plot(result, png)
    return [decisions, summary, png]


TRADE_OFFS = (
    ("slo_violation_share", 100.0, "% of requests waiting > SLO", "{:.3f} %"),
    ("p99_wait_s", 1.0, "p99 queue wait (s)", "{:.3f} s"),
    ("scaling_actions", 1.0, "replica count changes", "{:g}"),
)
"""The trade-off panels: (figure, scale, axis label, gpuscaler's value as the table
prints it), each against GPU-hours held."""
COLORS = {
    "reactive": "tab:blue",
    "keda_rate": "tab:orange",
    "predictive_floor": "tab:green",
    "dynamo_sla": "tab:purple",
}
NEAR = 0.75
"""Trade-off axes fit the points from this share of gpuscaler's GPU-hours up, so a curve's
far cheap end does not flatten the rest; points above are drawn on the top edge."""
FLOOR = {"slo_violation_share": 1.0, "p99_wait_s": 0.1, "scaling_actions": 1.0}
"""The least top of each trade-off axis (drawn unit), so all-zero figures stay readable."""


def plot(result: SimulationResult, path: Path) -> None:
    """The PNG of one result: the trade-offs, then each run's demand and capacity."""
    # matplotlib builds its font cache on its first import and logs that at INFO
    # through the root logger, which would put a JSON line in the middle of the report.
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with plt.rc_context({"font.size": 11, "legend.fontsize": 10}):
        fig = plt.figure(figsize=(14, 13))
        grid = fig.add_gridspec(3, len(TRADE_OFFS), height_ratios=(1, 1, 1))
        summary = result.summary()
        for i in range(len(TRADE_OFFS)):
            _trade_off(fig.add_subplot(grid[0, i]), result, summary, i)
        top = fig.add_subplot(grid[1, :])
        bottom = fig.add_subplot(grid[2, :], sharex=top, sharey=top)
        for ax, run in ((top, result.gpuscaler), (bottom, result.reactive)):
            _series(ax, result, run)
        bottom.set_xlabel("hours into trace")
        fig.suptitle(
            f"{result.p.trace}: each baseline swept over its target (90 % left .. 40 % right), "
            "gpuscaler's point and the equal-cost line\n"
            "GPU load derived from request counts (load model: docs/evaluation.md)"
        )
        fig.tight_layout()
        fig.savefig(path, dpi=80)
        plt.close(fig)


def _trade_off(ax: Any, result: SimulationResult, summary: dict[str, Any], i: int) -> None:
    """Panel `i` of TRADE_OFFS: every swept baseline against GPU-hours, on a linear axis,
    gpuscaler's point drawn over the curves and each curve read at its GPU-hours."""
    key, scale, label, shown_as = TRADE_OFFS[i]
    g, reactive = summary["gpuscaler"], summary["reactive"]
    curves = {
        name: sorted(((p["gpu_hours"], scale * p[key]) for p in curve), key=lambda xy: xy[0])
        for name, curve in result.baselines.items()
    }
    reads = {
        name: scale * at[key]
        for name, at in summary.get("equal_cost", {}).items()
        if at is not None and key in at
    }
    near = [y for pts in curves.values() for x, y in pts if x >= NEAR * g["gpu_hours"]]
    shown = [scale * g[key], scale * reactive[key], *reads.values(), *near]
    top = 1.15 * max(FLOOR[key], *shown)
    beyond = 0.0
    for name, pts in curves.items():
        x = np.array([p[0] for p in pts])
        y = np.array([p[1] for p in pts])
        color, named = COLORS.get(name, "tab:gray"), BASELINE_LABELS.get(name, name)
        ax.plot(x, np.minimum(y, top), marker="o", ms=4, color=color, label=named)
        if (y > top).any():
            ax.plot(x[y > top], np.full((y > top).sum(), top), "^", color=color, ms=9)
            beyond = max(beyond, float(y.max()))
        if name in reads:
            ax.plot(g["gpu_hours"], reads[name], "o", mfc="none", mec=color, ms=11)
    if beyond:
        note = f"\u25b2 beyond the axis (up to {beyond:.3g})"
        ax.annotate(note, (0.98, 0.12), xycoords="axes fraction", ha="right", color="0.3")
    ax.axvline(g["gpu_hours"], color="0.5", lw=0.8, ls=":", label="equal cost (gpuscaler's)")
    at_reactive = (reactive["gpu_hours"], scale * reactive[key])
    label_r = "reactive HPA at 70 %"
    ax.plot(*at_reactive, "s", color=COLORS["reactive"], mec="black", ms=9, label=label_r)
    at_g = (g["gpu_hours"], scale * g[key])
    ax.plot(*at_g, "*", color="black", mec="white", ms=20, zorder=10, label="gpuscaler")
    ax.set_ylim(-0.04 * top, top)
    ax.set_xlabel("GPU-hours held")
    ax.set_ylabel(label.replace("SLO", f"{result.p.config.simulator.slo_wait:g} s"))
    ax.set_title(f"{label.split(' (')[0]}: gpuscaler {shown_as.format(scale * g[key])}")
    if i == 0:
        ax.legend(loc="upper right")


def _series(ax: Any, result: SimulationResult, run: RunResult) -> None:
    """Demand, capacity, the forecast band and the decisions over time; requests over
    the SLO only where the table scores them (after the warm-up, shaded)."""
    p, config = run.plotted, result.p.config
    if p is None:
        raise ValueError(f"{run.policy}'s run was finished without its plot")
    scored_from = result.p.scored_from * run.slot / 3600
    if scored_from > 0:
        ax.axvspan(0, scored_from, color="0.92", label="warm-up, not scored")
    late = p.late[p.late >= scored_from]
    ax.plot(p.hours, p.demand, lw=0.6, color="0.45", label="demand (GPUs busy, 1 min mean)")
    ax.plot(p.hours, p.capacity, lw=1.0, color="tab:blue", label="ready capacity (GPUs)")
    if late.size:
        over = f"requests over the SLO ({config.simulator.slo_wait:g} s)"
        ax.plot(late, np.zeros(late.size), "|", color="tab:red", ms=10, label=over)
    if p.band is not None:
        cfg = config.forecast
        band = f"forecast {cfg.interval_level:.0%} band at +{cfg.horizon:.0f}s"
        ax.fill_between(*p.band, color="tab:orange", alpha=0.3, label=band)
    for kind, color in (("fragments", "tab:purple"), ("time_slice", "tab:green")):
        for i, t in enumerate(t for k, t in p.marks if k == kind):
            ax.axvline(t, color=color, lw=0.8, ls="--", label=f"{kind} change" if i == 0 else None)
    pre = [t for k, t in p.marks if k == "preemption"]
    if pre:
        ax.plot(pre, np.zeros(len(pre)), "v", color="black", ms=5, label="preemption step")
    ax.set_title("reactive HPA on utilization at 70 %" if run.policy == "reactive" else run.policy)
    ax.set_ylabel("GPUs")
    ax.legend(loc="upper left")
