"""Young windows (a controller just started, or targets just added: only the last minutes of
the window hold samples, as in bench/tick.py) are forecast from the last value or the
engine's own path, every such row at once (issue 18); bit for bit what the code before
gave one row at a time (tests/forecast_reference.py)."""

from __future__ import annotations

import forecast_reference as old
import numpy as np
import pytest
from builders import NOW
from test_forecast_batched import _signal, _state

from gpuscaler.config import ForecastConfig
from gpuscaler.core.forecast import forecast_series
from gpuscaler.core.model import FitState, FloatArray, Series

STEP = 5.0
POINTS = 240  # a 20-minute window of 5 s samples
TICK = 30.0
YOUNG = ForecastConfig(min_history="90s")  # acts on 90 s, as bench/tick.py's config


def _windows(n: int, seed: int, k: int, old_rows: int) -> tuple[list[Series | None], float]:
    """n windows at tick k: the first `old_rows` full, the rest observed only for the last
    100 s + k ticks (some with a gap, one flat, one noisy walk that the fit may drop)."""
    rng = np.random.default_rng(seed * 1000 + k)
    now = NOW + k * TICK
    t = np.arange(POINTS, dtype=np.float64)
    data: FloatArray = 40 + 10 * np.sin((t + 6 * k)[None, :] / rng.uniform(20, 90, (n, 1)))
    data = data + rng.normal(0, 3.0, (n, POINTS))
    observed = int((100.0 + k * TICK) / STEP)
    data[old_rows:, : POINTS - observed] = np.nan
    data[rng.random((n, POINTS)) < 0.02] = np.nan
    data[old_rows, -5:] = np.nan  # the newest samples missing
    data[old_rows + 1, POINTS - observed :] = 12.0  # flat: its fit is dropped
    data[old_rows + 2, POINTS - observed :] = np.cumsum(rng.normal(0, 8.0, observed))
    out: list[Series | None] = [Series(now - STEP * (POINTS - 1), STEP, row) for row in data]
    return out, now


@pytest.mark.parametrize(
    ("seed", "old_rows", "clip", "cfg"),
    [
        (1, 0, (0.0, 100.0), YOUNG),  # every row young
        (2, 4, (0.0, None), YOUNG),  # young rows batched with assessed ones
        (3, 0, (0.0, None), ForecastConfig(min_history="90s", ensemble=False)),
    ],
)
def test_young_windows_batched_forecast_and_keep_exactly_what_one_row_at_a_time_did(
    seed: int, old_rows: int, clip: tuple[float, float | None], cfg: ForecastConfig
) -> None:
    n = 12
    keys: list[str | None] = [f"y{i}" for i in range(n)]
    keys[-1] = None  # a row without a kept state
    new: dict[str, FitState] = {}
    ref: dict[str, FitState] = {}
    methods, reasons = set(), set()
    for k in range(12):  # 100 s to 430 s observed, a refit past 5 minutes
        series, now = _windows(n, seed, k, old_rows)
        got_states: dict[str, FitState] = {}
        want_states: dict[str, FitState] = {}
        got = forecast_series(series, cfg, now, None, clip, keys, new, got_states)
        want = old.forecast_series(series, cfg, now, None, clip, keys, ref, want_states)
        # repr: exact for floats, and a NaN (no fit) equals a NaN
        assert repr([_signal(s) for s in got]) == repr([_signal(s) for s in want]), f"tick {k}"
        assert sorted(got_states) == sorted(want_states)
        for key, state in got_states.items():
            assert repr(_state(state)) == repr(_state(want_states[key])), f"tick {k}, {key}"
        methods |= {s.forecast.method for s in got if s.forecast is not None}
        reasons |= {s.forecast.reason.split(":")[0] for s in got if s.forecast is not None}
        new, ref = got_states, want_states
    assert "last_value" in methods  # dropped fits: the last value and its own interval
    assert "last value" in reasons
    assert any(r.startswith("arima") for r in reasons)  # the engine's own path
