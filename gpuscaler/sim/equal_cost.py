"""The equal-cost figure: a baseline's trade-off curve (GPU-hours against SLO outcome,
one point per swept target) read at gpuscaler's own GPU-hours, and its dual, read at
gpuscaler's own SLO outcome."""

from __future__ import annotations

from typing import Any

import numpy as np

from gpuscaler.sim.scalers import ScalerKind

BASELINES: dict[str, ScalerKind] = {
    "reactive": "hpa_util",
    "keda_rate": "keda_rate",
    "predictive_floor": "predictive_floor",
    "dynamo_sla": "dynamo_sla",
}
"""Baseline name in the report -> the scaler that runs it."""
WHATIF_BASELINES = ("reactive", "keda_rate", "predictive_floor")
"""The baselines `whatif` sweeps on each workload's history: the Dynamo-style planner is
left to `simulate` and bench/equal_cost.py, where one replay pays for its fourth sweep."""
FIGURES = ("slo_violation_share", "p99_wait_s")


def sweep_targets() -> list[int]:
    """Target utilizations swept for every baseline: 40..90 % in steps of 5."""
    return list(range(40, 91, 5))


def equal_cost(curve: list[dict[str, Any]], gpu_hours: float) -> dict[str, Any] | None:
    """Each figure of `curve` linearly interpolated at `gpu_hours` along the curve
    sorted by GPU-hours; None (with the reason in `reason_outside`) when `gpu_hours`
    falls outside the curve."""
    if not curve:
        return None
    points = sorted(curve, key=lambda p: (p["gpu_hours"], -p["target_pct"]))
    hours = np.array([p["gpu_hours"] for p in points], dtype=np.float64)
    if not hours[0] <= gpu_hours <= hours[-1]:
        return None
    out: dict[str, Any] = {"gpu_hours": gpu_hours}
    for figure in FIGURES:
        values = np.array([p[figure] for p in points], dtype=np.float64)
        out[figure] = round(float(np.interp(gpu_hours, hours, values)), 6)
    return out


def reason_outside(curve: list[dict[str, Any]], gpu_hours: float) -> str | None:
    """Why `equal_cost` is None for this curve, or None when it is not."""
    if not curve:
        return "no curve"
    lo = min(curve, key=lambda p: p["gpu_hours"])
    hi = max(curve, key=lambda p: p["gpu_hours"])
    for sign, side, end, p in ((1, "below", "cheapest", lo), (-1, "above", "dearest", hi)):
        if sign * (p["gpu_hours"] - gpu_hours) > 0:
            return (
                f"gpuscaler's {gpu_hours:g} GPU-hours are {side} the curve's {end} point "
                f"({p['gpu_hours']:g} at target {p['target_pct']} %)"
            )
    return None


def hours_at_share(curve: list[dict[str, Any]], share: float) -> tuple[float, bool] | None:
    """(GPU-hours, at the sweep's edge) of the cheapest point of the curve, linear between
    targets, at or under `share` (None: none). At the edge, a cheaper target might too."""
    points = sorted(curve, key=lambda p: (p["gpu_hours"], -p["target_pct"]))
    prev: dict[str, Any] | None = None
    for p in points:
        if p["slo_violation_share"] <= share + 1e-12:
            if prev is None:
                return float(p["gpu_hours"]), True
            s0, s1 = prev["slo_violation_share"], p["slo_violation_share"]
            h0, h1 = prev["gpu_hours"], p["gpu_hours"]
            frac = (s0 - share) / (s0 - s1) if s0 != s1 else 1.0
            return float(h0 + frac * (h1 - h0)), False
        prev = p
    return None
