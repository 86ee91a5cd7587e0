"""The what-if verdict: GPU-hours saved at equal SLO and SLO violations avoided at equal
GPU-hours, each against the best baseline."""

from __future__ import annotations

from typing import Any

from gpuscaler.sim.equal_cost import hours_at_share

SHARE_MARGIN = 1e-4
"""SLO-violation shares closer than this (0.01 % of requests) count as equal."""
HOURS_MARGIN = 0.01
"""GPU-hours within 1 % count as equal."""


def compare(summary: dict[str, Any]) -> dict[str, Any]:
    """The what-if table's row: both figures against the best baseline, and the verdict."""
    g = summary["gpuscaler"]
    needed = {
        name: hours_at_share(curve, g["slo_violation_share"])
        for name, curve in summary.get("baselines", {}).items()
    }
    reached = {k: v for k, v in needed.items() if v is not None}
    saved = None
    if reached:
        best = min(reached, key=lambda k: reached[k][0])
        hours, edge = reached[best]
        saved = {
            "gpu_hours": round(hours - g["gpu_hours"], 3),
            "against": best,
            "at_sweep_edge": edge,
        }
    at_equal = {k: v for k, v in summary.get("equal_cost", {}).items() if v is not None}
    avoided = None
    if at_equal:
        best = min(at_equal, key=lambda k: at_equal[k]["slo_violation_share"])
        avoided = {
            "share": round(at_equal[best]["slo_violation_share"] - g["slo_violation_share"], 6),
            "against": best,
        }
    return {
        "gpu_hours_saved": saved,
        "violations_avoided": avoided,
        "verdict": verdict(g, saved, avoided),
    }


def verdict(g: dict[str, Any], saved: dict[str, Any] | None, avoided: dict[str, Any] | None) -> str:
    """`enable` when gpuscaler beats the best baseline on one axis and loses on neither;
    `keep reactive` when it does not; `not enough data` when neither axis compares."""
    if saved is None and avoided is None:
        return "not enough data"
    cheaper = saved is not None and saved["gpu_hours"] > HOURS_MARGIN * g["gpu_hours"]
    dearer = saved is not None and saved["gpu_hours"] < -HOURS_MARGIN * g["gpu_hours"]
    fewer = avoided is not None and avoided["share"] > SHARE_MARGIN
    more = avoided is not None and avoided["share"] < -SHARE_MARGIN
    return "enable" if (cheaper or fewer) and not (dearer or more) else "keep reactive"
