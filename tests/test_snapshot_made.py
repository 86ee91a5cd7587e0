"""The snapshot's observations, made for every pool and workload at every tick by writing
their fields (issue 20), are the objects their constructors make: every field, in order,
equal, hashed and frozen alike (a field added later fails here, not silently there)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from gpuscaler.config import ForecastConfig
from gpuscaler.core import snapshot
from gpuscaler.core.forecast import forecast_series
from gpuscaler.core.model import PoolObservation, Series, Signal, WorkloadObservation
from gpuscaler.core.snapshot import RawPool, RawWorkload, _pool, _workload

SIGNAL = Signal(1_000.0, None, "no samples in the window")
OTHER = Signal(None, None)


@pytest.mark.parametrize(
    ("raw", "stall", "stall_last"),
    [
        (RawPool("a100", None, None, 2, "2", 80.0, 3, None, 61.5, 12), 14.25, 990.0),
        (RawPool("a100", None, None, None, None), None, None),
        (RawPool("h100", None, None, 4, "4", problem="failed"), 30.0, 980.0),  # stall dropped
    ],
)
def test_a_pool_observation_is_the_one_its_constructor_makes(
    raw: RawPool, stall: float | None, stall_last: float | None
) -> None:
    got = _pool(raw, SIGNAL, stall, stall_last)
    want = PoolObservation(
        name=raw.name,
        utilization=SIGNAL,
        fragments=raw.fragments,
        time_slice_level=raw.time_slice_level,
        stall_mean_pct=None if raw.problem else stall,
        stall_last_sample_time=stall_last,
        gpu_memory_gib=raw.gpu_memory_gib,
        max_shares_held=raw.max_shares_held,
        memory_used_gib=raw.memory_used_gib,
        gpus_held=raw.gpus_held,
    )
    _same(got, want)


@pytest.mark.parametrize(
    ("raw", "peak"),
    [
        (RawWorkload("ns/Deployment/a", None, 2, 3, 10, 0.5, None, (12.5, "req/s")), 140.0),
        (RawWorkload("ns/ScaledObject/b", None, None, None), None),
    ],
)
def test_a_workload_observation_is_the_one_its_constructor_makes(
    raw: RawWorkload, peak: float | None
) -> None:
    got = _workload(raw, OTHER, peak)
    want = WorkloadObservation(
        key=raw.key,
        load=OTHER,
        floor=raw.floor,
        replicas=raw.replicas,
        max_replicas=raw.max_replicas,
        replica_gpu_share=raw.replica_gpu_share,
        serving=raw.serving,
        recent_peak=peak,
    )
    _same(got, want)


def _same(got: object, want: object) -> None:
    assert type(got) is type(want)
    names = [f.name for f in dataclasses.fields(type(want))]  # type: ignore[arg-type]
    assert list(vars(got)) == names == list(vars(want))
    for name in names:
        assert getattr(got, name) is getattr(want, name)
    assert got == want and hash(got) == hash(want) and repr(got) == repr(want)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(got, names[0], None)


def test_series_of_equal_sections_in_other_objects_are_forecast_in_one_batch_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`_forecasts` groups the series by their forecast section's identity first, then by
    its value: equal sections in two objects give one batch, rows in the items' order."""
    rng = np.random.default_rng(3)
    series = [Series(0.0, 5.0, rng.normal(50, 5, 240)) for _ in range(5)]
    shared, other = ForecastConfig(), ForecastConfig()
    assert shared == other and shared is not other
    calls: list[list[str | None]] = []
    inner = forecast_series

    def counted(*args: Any, **kwargs: Any) -> list[Signal]:
        calls.append(list(kwargs["keys"]))
        return inner(*args, **kwargs)

    monkeypatch.setattr(snapshot, "forecast_series", counted)
    cfgs = [shared, other, shared, ForecastConfig(horizon="2m"), other]
    items: list[tuple[str, Series | None, str | None, ForecastConfig]] = [
        (f"s{i}", s, None, cfg) for i, (s, cfg) in enumerate(zip(series, cfgs, strict=True))
    ]
    got = snapshot._forecasts(items, 1_200.0, [(0.0, None)] * 5, None, {}, {})
    assert calls == [["s0", "s1", "s2", "s4"], ["s3"]]
    alone = [
        inner([s], cfg, 1_200.0, clips=[(0.0, None)])[0]
        for s, cfg in zip(series, cfgs, strict=True)
    ]
    for g, a in zip(got, alone, strict=True):
        assert g.forecast is not None and a.forecast is not None
        assert g.forecast.mean.tobytes() == a.forecast.mean.tobytes()
        assert g.forecast.reason == a.forecast.reason
