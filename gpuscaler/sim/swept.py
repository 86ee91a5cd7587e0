"""What a sweep gives of each run (`SweepResult`), and which replays may share a sweep
(`same_model`): `gpuscaler.sim.sweep` runs them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuscaler.core.model import FloatArray
from gpuscaler.sim.cluster import Recorder, SimulatedCluster
from gpuscaler.sim.scalers import IntArray, ScalerKind


@dataclass
class SweepResult:
    """What the figures of one baseline run read (`simulate.slo_figures`)."""

    kind: ScalerKind
    target_pct: float
    served: FloatArray
    gpu_sums: IntArray
    """The GPUs held in each slot, summed over its `sub` samples (-1: not simulated)."""
    sub: int
    replica_changes: list[tuple[float, int, int]]
    recorder: Recorder | None = None
    """The run's whole record (as its `SimulatedCluster` keeps it), when asked for."""

    @property
    def gpus(self) -> FloatArray:
        """The GPUs held in each slot (NaN: not simulated), built when read."""
        return held_gpus(self.gpu_sums, self.sub)


def held_gpus(sums: IntArray, sub: int) -> FloatArray:
    """The GPUs held in each slot from their sums over the slot's `sub` samples: the mean
    `SimulatedCluster._pods_at` takes, to the bit (the counts are whole numbers, so their
    float sum is exact and the mean is that sum over `sub`), NaN where a sum is -1."""
    out = sums / sub
    out[sums < 0] = np.nan
    return np.asarray(out, dtype=np.float64)


def same_model(a: SimulatedCluster, b: SimulatedCluster) -> bool:
    """Whether replays `a` and `b` can share a sweep: the same range, slots, simulator
    settings, fragments and signal noise (the same seed), arrivals of their own."""
    return (
        a.start == b.start
        and a.slot == b.slot
        and len(a.arrivals) == len(b.arrivals)
        and a.fragments == b.fragments
        and a.sim == b.sim
        and a.config.control.interval == b.config.control.interval
        and a.config.forecast.horizon == b.config.forecast.horizon
        and np.array_equal(a.noise, b.noise)
        and np.array_equal(a.dropped, b.dropped)
    )
