"""The snapshot batches the series whose forecast sections are equal."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import numpy as np
import pytest

from gpuscaler.config import ForecastConfig
from gpuscaler.core import snapshot
from gpuscaler.core.forecast import EMPTY, ForecastState, forecast
from gpuscaler.core.model import PoolObservation, Series, Signal, WorkloadObservation


def test_series_of_equal_sections_in_other_objects_are_forecast_in_one_batch_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`_forecasts` groups the series by their forecast section's value: equal sections in
    two objects give one batch, rows in the items' order; each row forecast as alone."""
    rng = np.random.default_rng(3)
    series = [Series(0.0, 5.0, rng.normal(50, 5, 240)) for _ in range(5)]
    shared, other = ForecastConfig(), ForecastConfig()
    assert shared == other and shared is not other
    calls: list[list[str | None]] = []
    inner = forecast

    def counted(*args: Any, **kwargs: Any) -> tuple[list[Signal], ForecastState]:
        calls.append(list(kwargs["keys"]))
        return inner(*args, **kwargs)

    monkeypatch.setattr(snapshot, "forecast", counted)
    cfgs = [shared, other, shared, ForecastConfig(horizon="2m"), other]
    items: list[tuple[str, Series | None, str | None, ForecastConfig]] = [
        (f"s{i}", s, None, cfg) for i, (s, cfg) in enumerate(zip(series, cfgs, strict=True))
    ]
    got, _ = snapshot._forecasts(items, 1_200.0, [(0.0, None)] * 5, EMPTY)
    assert calls == [["s0", "s1", "s2", "s4"], ["s3"]]
    alone = [
        inner([s], cfg, 1_200.0, clips=[(0.0, None)])[0][0]
        for s, cfg in zip(series, cfgs, strict=True)
    ]
    for g, a in zip(got, alone, strict=True):
        assert g.forecast is not None and a.forecast is not None
        np.testing.assert_allclose(g.forecast.mean, a.forecast.mean, rtol=1e-9)
        assert g.forecast.reason == a.forecast.reason


def test_observations_made_by_position_hold_every_field_as_by_name() -> None:
    """`_pool` and `_workload` pass their fields by position (issue 20, fb8): each field
    gets its own value, a distinct one here, as the keywords gave it."""
    signal = Signal(12.0, None, "why")
    pool = snapshot.RawPool(
        "p", None, None, 3, "ts-2", 80.0, 4, None, memory_used_gib=7.5, gpus_held=6
    )
    want_pool = PoolObservation(
        name="p",
        utilization=signal,
        fragments=3,
        time_slice_level="ts-2",
        stall_mean_pct=41.0,
        stall_last_sample_time=11.0,
        gpu_memory_gib=80.0,
        max_shares_held=4,
        memory_used_gib=7.5,
        gpus_held=6,
    )
    got = snapshot._pool(pool, signal, 41.0, 11.0)
    assert got == want_pool
    assert [getattr(got, f.name) for f in fields(got)] == [
        getattr(want_pool, f.name) for f in fields(want_pool)
    ]
    with_problem = snapshot._pool(replace(pool, problem="stale"), signal, 41.0, 11.0)
    assert with_problem.stall_mean_pct is None
    load = snapshot.RawWorkload("ns/w", None, 2, 5, 9, 0.5, None, (3.0, "rate"))
    want_load = WorkloadObservation(
        key="ns/w",
        load=signal,
        floor=2,
        replicas=5,
        max_replicas=9,
        replica_gpu_share=0.5,
        serving=(3.0, "rate"),
        recent_peak=77.0,
    )
    got_load = snapshot._workload(load, signal, 77.0)
    assert [getattr(got_load, f.name) for f in fields(got_load)] == [
        getattr(want_load, f.name) for f in fields(want_load)
    ]
