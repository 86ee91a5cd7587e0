"""A time slice's history kept as it is when nothing in it changes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuscaler.core.model import TargetHistory
from gpuscaler.core.time_slice import _calm_since

NOW = 1_700_000_000.0


@pytest.mark.parametrize("calm_since", [None, NOW - 60.0])
@pytest.mark.parametrize("to", [None, NOW - 60.0, NOW])
def test_a_time_slice_history_is_kept_as_it_is_only_when_its_calm_time_is_the_same(
    calm_since: float | None, to: float | None
) -> None:
    h = TargetHistory(calm_since=calm_since, last_change_at=NOW - 5.0, pending_direction=1)
    value = h.calm_since if to == calm_since else to  # the very value, as decide_time_slice
    got = _calm_since(h, value)
    assert got == replace(h, calm_since=value)
    assert (got is h) == (to == calm_since)
