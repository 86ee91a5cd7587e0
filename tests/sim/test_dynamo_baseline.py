"""The Dynamo-style SLA planner baseline: its Kalman predictor of the next interval's
requests, and the load it asks replicas for between its adjustments."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuscaler.sim.scalers import DYNAMO_INTERVAL, dynamo_loads, kalman_predictions


@pytest.mark.parametrize(
    ("counts", "expect"),
    [
        ([50.0] * 40, 50.0),  # a level: predicted as itself
        ([10.0 + 3.0 * i for i in range(40)], 10.0 + 3.0 * 40),  # a ramp: its next value
        ([max(0.0, 100.0 - 5.0 * i) for i in range(40)], 0.0),  # fallen to none
    ],
    ids=["level", "ramp", "fall"],
)
def test_the_kalman_predictor_follows_a_level_and_a_trend(
    counts: list[float], expect: float
) -> None:
    assert kalman_predictions(np.asarray(counts))[-1] == pytest.approx(expect, abs=0.5)


@given(st.lists(st.floats(0, 1e4), min_size=1, max_size=50))
def test_predictions_are_finite_and_never_negative(counts: list[float]) -> None:
    out = kalman_predictions(np.asarray(counts))
    assert out.shape == (len(counts),) and np.isfinite(out).all() and (out >= 0).all()


def test_the_load_is_unknown_until_an_interval_is_done_then_held_until_the_next() -> None:
    slot, gps = 10.0, 0.5
    width = round(DYNAMO_INTERVAL / slot)
    requests = np.concatenate([np.full(width, 2.0), np.full(width, 4.0), np.full(5, 9.0)])
    cursors = np.arange(len(requests) + 1)
    loads = dynamo_loads(requests, cursors, slot, gps)
    assert np.isnan(loads[:width]).all()
    first = 100.0 * (2.0 * width) / DYNAMO_INTERVAL * gps  # the first count predicts itself
    assert loads[width : 2 * width] == pytest.approx(first)
    second = kalman_predictions(np.array([2.0 * width, 4.0 * width]))[-1]
    assert loads[2 * width :] == pytest.approx(100.0 * second / DYNAMO_INTERVAL * gps)
