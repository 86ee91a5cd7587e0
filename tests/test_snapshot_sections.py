"""The snapshot batches the series whose forecast sections are equal, grouping them by
the section object's identity first (issue 20: one hash a section object, not a series)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpuscaler.config import ForecastConfig
from gpuscaler.core import snapshot
from gpuscaler.core.forecast import forecast_series
from gpuscaler.core.model import Series, Signal


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
