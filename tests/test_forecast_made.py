"""The forecast's per-series objects made by `made` (issue 20: without the frozen
dataclass' `__init__`) are the objects the constructor makes, field by field."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from gpuscaler.core.forecast import made
from gpuscaler.core.model import (
    FitState,
    Forecast,
    IntervalState,
    IssuedInterval,
    Scored,
    Signal,
)

_ARRAY = np.arange(6.0).reshape(2, 3)
_PENDING = (IssuedInterval(1.0, 10.0, (1.0, 2.0), (3.0, 4.0)),)
_INTERVAL = IntervalState(0.87, 5.0, _PENDING, 12, 2)
_SCORED = Scored(
    "ensemble", (1.0, 2.0), {"ensemble": 1.5}, 3, _ARRAY[0], _ARRAY, 0.25, _ARRAY, _ARRAY[1], 99.0
)

CASES: list[tuple[type[Any], Callable[..., Any], tuple[Any, ...]]] = [
    (Signal, made.signal, (100.0, None, "no samples in the window")),
    (Signal, made.signal, (None, None, None)),
    (IntervalState, made.interval_state, (0.9, 100.0, _PENDING, 7, 1, ((1.0, 10.0, 2),), _ARRAY)),
    (IntervalState, made.interval_state, (0.8, 110.0, (), 0, 0, None, None)),
    (
        Scored,
        made.scored,
        ("last_value", (1.0,), {"a": 1.0}, 0, _ARRAY[0], _ARRAY, -0.5, _ARRAY, _ARRAY[1], 10.0),
    ),
    (Scored, made.scored, (None, (), {}, 2, _ARRAY[0], _ARRAY, 0.0, _ARRAY, _ARRAY[1], 0.0)),
    (
        Forecast,
        made.forecast,
        (
            100.0,
            10.0,
            _ARRAY[0],
            _ARRAY[0] - 1,
            _ARRAY[0] + 1,
            0.9,
            "ensemble",
            "why",
            3.0,
            {"ensemble": 1.0},
            0.5,
        ),
    ),
]


@pytest.mark.parametrize(("cls", "maker", "values"), CASES)
def test_a_made_object_has_every_field_the_constructor_gives_it_and_nothing_else(
    cls: type[Any], maker: Callable[..., Any], values: tuple[Any, ...]
) -> None:
    got, want = maker(*values), cls(*values)
    assert type(got) is cls
    names = [f.name for f in dataclasses.fields(cls)]
    assert list(vars(got)) == names == list(vars(want))  # every field, in order
    for name in names:
        assert getattr(got, name) is getattr(want, name)
    assert repr(got) == repr(want)


@pytest.mark.parametrize(("cls", "maker", "values"), CASES[:4])
def test_made_states_compare_and_hash_as_constructed_ones_and_stay_frozen(
    cls: type[Any], maker: Callable[..., Any], values: tuple[Any, ...]
) -> None:
    got, want = maker(*values), cls(*values)
    assert got == want
    assert hash(got) == hash(want)
    first = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(got, first, 1.0)
    assert dataclasses.replace(got) == want


@pytest.mark.parametrize("scored", [_SCORED, None])
def test_a_carried_state_is_the_state_replaced_with_its_interval_and_scoring(
    scored: Scored | None,
) -> None:
    state = FitState(50.0, 0.1, (0.3, -0.2), 2.5, None, None, 0.7)
    got, want = (
        made.carried(state, _INTERVAL, scored),
        dataclasses.replace(state, interval=_INTERVAL, scored=scored),
    )
    assert type(got) is FitState
    assert list(vars(got)) == list(vars(want))
    for name in vars(want):
        assert getattr(got, name) is getattr(want, name)
    assert got == want and hash(got) == hash(want)
