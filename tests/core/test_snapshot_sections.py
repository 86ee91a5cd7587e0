"""The snapshot batches the series whose forecast sections are equal."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from gpuscaler.config import ForecastConfig
from gpuscaler.core import snapshot
from gpuscaler.core.forecast import EMPTY, ForecastState, forecast
from gpuscaler.core.model import Series, Signal


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


def test_a_pool_whose_source_failed_has_no_stall_mean() -> None:
    pool = snapshot.RawPool("p", None, None, 3, "ts-2")
    assert snapshot._pool(pool, Signal(12.0, None), 41.0, 11.0).stall_mean_pct == 41.0
    failed = replace(pool, problem="stale")
    assert snapshot._pool(failed, Signal(12.0, None, "why"), 41.0, 11.0).stall_mean_pct is None
