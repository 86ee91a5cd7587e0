"""A workload's demand from its serving metrics: presets for the common inference servers.

On a shared GPU dcgm-exporter cannot attribute utilization to one pod, so a workload's GPU
load is not its demand; the serving stack knows its own queue. Each preset is a PromQL
template over the workload's pods (`{matchers}`) whose unit it names; `per_replica` says
how much of it one replica serves at target. Metric names are the servers' own: vLLM
(`vllm/v1/metrics/loggers.py`), Text Generation Inference (`router/src/server.rs`) and
Triton (`src/metrics.cc`).
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


def _last(metric: str) -> str:
    """The sum over the workload's pods of a gauge's newest value within the lookback."""
    return f"sum(last_over_time({metric}{{{{{{matchers}}}}}}[{{lookback}}]))"


PRESETS: dict[str, tuple[str, str]] = {
    # name: (PromQL template, unit of its value)
    "vllm": (
        f"{_last('vllm:num_requests_running')} + {_last('vllm:num_requests_waiting')}",
        "requests (running + waiting)",
    ),
    "tgi": (
        f"{_last('tgi_queue_size')} + {_last('tgi_batch_current_size')}",
        "requests (queued + in batch)",
    ),
    "triton_queue": (_last("nv_inference_pending_request_count"), "pending requests"),
    "triton_rate": (
        # A rate needs two samples in its range: 1m holds four at the default 15 s scrape.
        "sum(rate(nv_inference_count{{{matchers}}}[1m]))",
        "inferences/s",
    ),
}
"""The shipped demand presets (templates use the placeholders of PrometheusQueries)."""

DEMAND_BOUNDS = (0.0, 1e9)
"""Requests or inferences per second of one workload: negative or above a billion is a
broken exporter or query, never an action."""


def check_template(value: str, need_matchers: bool = True) -> str:
    """`value` when it is a PromQL template with only {matchers} and {lookback}."""
    try:
        value.format(matchers='a="b"', lookback="1s")
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"template must use only {{matchers}} and {{lookback}} (double other braces): {e}"
        ) from e
    if need_matchers and "{matchers}" not in value:
        raise ValueError("template must contain {matchers}")
    return value


class DemandConfig(BaseModel):
    """Where a workload's demand comes from instead of its pods' GPU utilization."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: Literal["vllm", "tgi", "triton_queue", "triton_rate", "query"]
    """A shipped preset, or `query` for the template in `query`."""
    per_replica: float = Field(gt=0)
    """Demand one replica serves at target, in the preset's unit (e.g. vLLM: 16 running
    + waiting requests per replica). The floor is ceil(forecast upper / per_replica)."""
    query: str | None = None
    """With preset `query`: any PromQL template giving one series; `{matchers}` (the
    workload's pods) and `{lookback}` are optional here."""
    unit: str | None = None
    """Unit of the query's value, for reasons and logs (presets name their own)."""

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.preset == "query":
            if not self.query:
                raise ValueError("preset query needs `query`: a PromQL template")
            check_template(self.query, need_matchers=False)
        elif self.query is not None:
            raise ValueError(f"`query` is only for preset query, not {self.preset}")
        return self

    @property
    def template(self) -> str:
        if self.preset == "query":
            assert self.query is not None
            return self.query
        return PRESETS[self.preset][0]

    @property
    def unit_name(self) -> str:
        if self.unit:
            return self.unit
        return PRESETS[self.preset][1] if self.preset in PRESETS else "demand units"


DEMAND_ANNOTATION = "gpuscaler.io/demand"
"""On an opted-in ScaledObject or HPA the config does not list: `<preset>:<per_replica>`,
e.g. `vllm:16` (a query of one's own needs the config)."""


def demand_from_annotation(value: str) -> DemandConfig:
    """The demand an annotation names; ValueError saying what is wrong with it."""
    preset, sep, per_replica = value.partition(":")
    if not sep:
        raise ValueError(f"{value!r} is not <preset>:<per_replica> (e.g. vllm:16)")
    try:
        return DemandConfig(preset=preset.strip(), per_replica=per_replica.strip())
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'value'}: {err['msg']}" for err in e.errors()
        )
        raise ValueError(f"{value!r}: {problems}") from None
