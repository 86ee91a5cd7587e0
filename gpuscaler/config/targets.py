"""What gpuscaler manages: node pools and workloads, each with its overrides."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    field_validator,
)

from gpuscaler.config.base import StrictModel, only_sections
from gpuscaler.config.control import (
    ForecastConfig,
    FragmentsConfig,
    ReplicasConfig,
    TimeSliceConfig,
)
from gpuscaler.demand import DemandConfig


class NodeSelector(StrictModel):
    label: str = Field(min_length=1)
    value: str = Field(min_length=1)


class NodePoolConfig(StrictModel):
    name: str = Field(min_length=1, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    selector: NodeSelector
    gpu_memory_gib: float = Field(gt=0)
    """Memory of one GPU of the pool (e.g. 80 for an A100 80GB)."""
    workload_type: Literal["training", "inference"] = "inference"
    """Sets the fragment memory floor."""
    profile: Literal["compute_bound", "io_bound"] = "compute_bound"
    """Sets the base time slice level."""
    sharing: Literal["time-slicing", "mps"] = "time-slicing"
    initial_fragments: int | None = Field(None, ge=1)
    """Fragments assumed when no adapter reports them (simulator, first cycle)."""
    metrics_matchers: dict[str, str] = Field(default_factory=dict)
    """Exact-match labels that select this pool's GPU series in Prometheus, e.g.
    {modelName: NVIDIA A100-SXM4-80GB} or {Hostname: gpu-node-1} ("Hostname" also matches
    the lowercase "hostname" newer dcgm-exporters use). Values are escaped."""
    overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @field_validator("metrics_matchers")
    @classmethod
    def _label_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:  # Prometheus' grammar; a value may be anything (it is escaped)
            if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", name) or name.startswith("__"):
                raise ValueError(
                    f"{name!r} is not a Prometheus label name (letters, digits and '_', not "
                    "starting with a digit or '__')"
                )
        return value

    @field_validator("overrides")
    @classmethod
    def _sections(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return only_sections(value, POOL_OVERRIDABLE, "a node pool")


class WorkloadConfig(StrictModel):
    namespace: str = Field(min_length=1)
    kind: Literal["ScaledObject", "HorizontalPodAutoscaler"]
    name: str = Field(min_length=1)
    type: Literal["training", "inference"] = "inference"
    node_pool: str | None = None
    """The pool it runs on (for fragments and preemption); optional."""
    priority: int | None = None
    """Priority of its pods. At or above preemption.beneficiary_min_priority, with
    preemption.forecast_trigger on, replicas its forecast floor asks for that do not fit
    the pool free GPUs ahead of time."""
    gpus_per_replica: int = Field(1, ge=1)
    """GPU shares one replica requests (nvidia.com/gpu)."""
    demand: DemandConfig | None = None
    """Demand from the serving stack's own metrics (a preset: vllm, tgi, triton_queue,
    triton_rate, or any query) instead of its pods' GPU utilization; gpuscaler.demand."""
    leading_query: str | None = Field(None, min_length=1)
    """PromQL of the workload's demand (request rate, queue length), sent as written: a
    leading signal. Its forecast, mapped to GPU load by a ratio fitted per workload, replaces
    the load's own forecast when it has been clearly more accurate on recent history; the
    decision's reason says which signal won."""
    overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"

    @field_validator("overrides")
    @classmethod
    def _sections(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return only_sections(value, WORKLOAD_OVERRIDABLE, "a workload")


POOL_OVERRIDABLE: dict[str, type[BaseModel]] = {
    "fragments": FragmentsConfig,
    "time_slice": TimeSliceConfig,
    "forecast": ForecastConfig,
}
WORKLOAD_OVERRIDABLE: dict[str, type[BaseModel]] = {
    "replicas": ReplicasConfig,
    "forecast": ForecastConfig,
}
