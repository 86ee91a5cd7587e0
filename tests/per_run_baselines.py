"""The baselines as they ran before the sweep (one `SimulatedCluster` and one Python loop
per swept target), kept as the reference the sweep must equal bit for bit
(tests/test_sweep.py) and the speed it is measured against (bench/sweeps.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuscaler.config import Config
from gpuscaler.core.model import FloatArray
from gpuscaler.sim.equal_cost import BASELINES, sweep_targets
from gpuscaler.sim.simulate import _run, slo_metrics


def per_run_baselines(
    config: Config,
    start: float,
    seconds: float,
    arrivals: FloatArray,
    seed: int,
    scored: int,
    targets: Sequence[float] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """`simulate.run_baselines`, one run at a time."""
    slo = config.simulator.slo_wait
    curves: dict[str, list[dict[str, Any]]] = {}
    for name, kind in BASELINES.items():
        curves[name] = []
        predicted: dict[int, float] = {}  # the same demand at every target: forecast once
        for target in sweep_targets() if targets is None else targets:
            scaler = (kind, target)
            run = _run(
                name, config, start, seconds, arrivals, seed, scaler=scaler, predicted=predicted
            )
            curves[name].append({"target_pct": target, **slo_metrics(run.cluster, scored, slo)})
    return curves
