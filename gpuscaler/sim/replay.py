"""A replay of a load trace, checked and ready to run (`prepare`): its config, range,
warm-up and arrivals, and which replays can run as one model (`one_model`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuscaler.config import Config, NodePoolConfig, WorkloadConfig
from gpuscaler.core.model import FloatArray
from gpuscaler.sim.load import arrivals_from_trace
from gpuscaler.sim.trace import Trace, TraceError

DEFAULT_POOL = NodePoolConfig(
    name="a100-80gb",
    selector={"label": "nvidia.com/gpu.product", "value": "NVIDIA-A100-SXM4-80GB"},
    gpu_memory_gib=80,
    workload_type="inference",
    profile="compute_bound",
    initial_fragments=2,
)
DEFAULT_WORKLOAD = WorkloadConfig(
    namespace="default",
    kind="ScaledObject",
    name="llm-chat",
    type="inference",
    node_pool="a100-80gb",
    # Replica counts scale with fragments (8 fragments: 8 replicas a GPU).
    overrides={"replicas": {"max_replicas": 200}},
)
MIN_SECONDS = 1800.0
"""Shortest replay: 30 minutes."""


class ModelError(ValueError):
    """Replays that cannot run as one model (the message says why)."""


def scenario_config(config: Config) -> Config:
    """The config, with the built-in scenario added when no workload names a pool."""
    if any(w.node_pool for w in config.workloads):
        return config
    return config.model_copy(
        update={
            "node_pools": (*config.node_pools, DEFAULT_POOL),
            "workloads": (*config.workloads, DEFAULT_WORKLOAD),
        }
    )


def scenario(config: Config) -> tuple[WorkloadConfig, NodePoolConfig]:
    """The workload simulated (the first that names a pool) and its pool."""
    workload = next(w for w in config.workloads if w.node_pool)
    return workload, next(p for p in config.node_pools if p.name == workload.node_pool)


@dataclass(frozen=True, eq=False)
class Prepared:
    """A replay checked and ready to run: its config, range and arrivals."""

    trace: str
    config: Config
    start: float
    seconds: float
    arrivals: FloatArray
    seed: int
    scored_from: int
    """First scored slot (after the warm-up)."""
    forecast_from: float
    """Seconds into the replay from which the forecast runs (before, the controller's
    floor sizes for the observed demand alone)."""

    def key(self) -> tuple[float, float, int, str]:
        """Replays of equal keys run as one model: one range and seed, one config but for
        their workloads and pools."""
        shared = self.config.model_copy(update={"workloads": (), "node_pools": ()})
        return (self.start, self.seconds, self.seed, shared.model_dump_json())

    def ticks(self) -> list[float]:
        """Every control.interval after the start through its end, summed one interval at a
        time (the same floats in every run)."""
        ticks, t, interval = [], self.start, self.config.control.interval
        while (t := t + interval) <= self.start + self.seconds:
            ticks.append(t)
        return ticks


def one_model(preps: Sequence[Prepared]) -> None:
    """Raise ModelError unless every replay of `preps` has the first one's key."""
    key = preps[0].key()
    for p in preps[1:]:
        if p.key() != key:
            raise ModelError(
                f"{p.trace}: its range, seed or config (workloads and pools aside) differs "
                f"from {preps[0].trace}'s"
            )


def prepare(
    trace: Trace, hours: float | None, seed: int, config: Config, start_hours: float = 0.0
) -> Prepared:
    """`hours` of `trace` (all of it when None) from `start_hours` into it, checked."""
    config = scenario_config(config)
    # The forecaster refuses samples coarser than forecast.fit_step, and a control tick
    # must see at least one new slot.
    slot, fit_step = config.simulator.slot, config.forecast.fit_step
    limit = min(fit_step, config.control.interval)
    if slot > limit + 1e-9:
        raise TraceError(
            f"{trace.name}: simulator.slot {slot:g}s is coarser than forecast.fit_step "
            f"({fit_step:g}s) or control.interval ({config.control.interval:g}s); "
            f"use a slot of at most {limit:g}s"
        )
    offset = start_hours * 3600.0
    available = trace.duration - offset
    seconds = available if hours is None else hours * 3600.0
    if offset < 0 or seconds > available + 1e-9:
        raise TraceError(
            f"{trace.name}: {seconds / 3600:g} h from hour {start_hours:g} asked, the trace "
            f"holds {trace.duration / 3600:.2f} h"
        )
    scored_from, forecast_from = warmup_plan(config, seconds, trace.name)
    start = trace.start + offset
    arrivals = arrivals_from_trace(trace, start, seconds, seed, config.simulator.slot)
    return Prepared(trace.name, config, start, seconds, arrivals, seed, scored_from, forecast_from)


def warmup_plan(config: Config, seconds: float, name: str) -> tuple[int, float]:
    """(first scored slot, seconds before the forecast starts). A replay long enough for
    one metrics window plus the horizon is scored after that window; a shorter one (at
    least 30 minutes and min_history plus the horizon) after min_history."""
    window, horizon = config.metrics.window, config.forecast.horizon
    min_history, slot = config.forecast.min_history, config.simulator.slot
    if seconds >= window + horizon + config.control.interval:
        return int(window / slot), min_history
    needed = max(MIN_SECONDS, min_history + horizon)
    if seconds < needed - 1e-9:
        # Below 30 minutes no setting helps; above it, a shorter history or horizon does.
        remedy = (
            f"supply at least {MIN_SECONDS / 60:.0f} min of trace (the shortest replay)"
            if seconds < MIN_SECONDS
            else f"supply at least {needed / 60:.0f} min of trace, or set forecast.min_history "
            f"to at most {(seconds - horizon) / 60:.0f} min (or forecast.horizon lower)"
        )
        raise TraceError(
            f"{name}: {seconds / 60:.1f} min is shorter than one forecast window "
            f"({needed / 60:.0f} min: forecast.min_history "
            f"{min_history / 60:g} min + horizon {horizon / 60:g} min, at least 30 min); "
            f"{remedy}"
        )
    return int(min_history / slot), min_history
