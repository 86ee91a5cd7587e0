"""`quick_init` (issue 20): a frozen dataclass' instances made by its quicker `__init__`
are those its own `__init__` makes, and a class where they would differ is refused."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np
import pytest

from gpuscaler.core.decisions import ReplicaFloorDecision, Skip
from gpuscaler.core.lazy import Lazy
from gpuscaler.core.model import History, Series, Snapshot, TargetHistory
from gpuscaler.core.quick import quick_init
from gpuscaler.core.snapshot import RawPool


def _sample(quick: bool) -> type[Any]:
    """A frozen dataclass with a default, a default factory and a class variable; with
    `quick`, through `quick_init`."""

    @dataclasses.dataclass(frozen=True)
    class Sample:
        name: str
        value: float = 1.5
        tags: Mapping[str, int] = dataclasses.field(default_factory=dict)
        kind: ClassVar[str] = "sample"

    return quick_init(Sample) if quick else Sample


def _slotted(quick: bool) -> type[Any]:
    """A frozen dataclass with slots, a default and a default factory."""

    @dataclasses.dataclass(frozen=True, slots=True)
    class Slotted:
        tags: Mapping[str, int] = dataclasses.field(default_factory=dict)
        value: float = -2.5

    return quick_init(Slotted) if quick else Slotted


Sample, QuickSample = _sample(False), _sample(True)
Slotted, QuickSlotted = _slotted(False), _slotted(True)


CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    (("a",), {}),
    (("a", 2.0), {}),
    (("a",), {"tags": {"x": 1}}),
    ((), {"name": "b", "value": -1.0, "tags": {}}),
    (("a", 3.0, {"y": 2}), {}),
]


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_a_quick_instance_holds_the_fields_the_dataclass_gives_in_their_order(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    got, want = QuickSample(*args, **kwargs), Sample(*args, **kwargs)
    assert list(vars(got).items()) == list(vars(want).items())
    assert repr(got) == repr(want)


SLOTTED_CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((), {}),
    (({"x": 1},), {}),
    (({"x": 1}, 4.0), {}),
    ((), {"value": 0.5}),
]


@pytest.mark.parametrize(("args", "kwargs"), SLOTTED_CALLS)
def test_a_quick_instance_with_slots_holds_the_fields_the_dataclass_gives(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    got, want = QuickSlotted(*args, **kwargs), Slotted(*args, **kwargs)
    assert not hasattr(got, "__dict__")
    assert [getattr(got, n) for n in got.__slots__] == [getattr(want, n) for n in want.__slots__]
    assert repr(got) == repr(want)


def test_a_default_factory_is_called_for_each_instance_left_without_the_field() -> None:
    first, second = QuickSample("a"), QuickSample("b")
    assert first.tags == {} and first.tags is not second.tags


def test_a_quick_instance_stays_frozen_compared_and_hashed_by_its_fields() -> None:
    s = QuickSample("a", 2.0, MappingProxyType({}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.value = 3.0
    assert s == QuickSample("a", 2.0, MappingProxyType({})) and s != QuickSample("a")
    assert dataclasses.replace(s, value=4.0) == QuickSample("a", 4.0, MappingProxyType({}))


def test_a_missing_or_unknown_argument_fails_as_the_dataclass_fails() -> None:
    for cls in (Sample, QuickSample):
        with pytest.raises(TypeError):
            cls()
        with pytest.raises(TypeError):
            cls("a", other=1)


def test_the_core_s_hot_classes_are_made_quickly_and_as_before() -> None:
    values = np.arange(3.0)
    series = Series(1.0, 10.0, values)
    assert vars(series) == {"start": 1.0, "step": 10.0, "values": values}
    pool = RawPool("p", series, None, 2, "none", 80.0, gpus_held=3)
    assert pool.max_shares_held == 0 and pool.problem is None and pool.gpus_held == 3
    assert Snapshot(5.0).fits == {} and History().targets == {}
    d = ReplicaFloorDecision(1.0, "w", 1, 2, "up")
    assert d.forecast is None and d.direction == 1
    h = TargetHistory(last_direction=1)
    assert h == TargetHistory(None, 1) and h.seen == () and h.seen_rows is None
    assert dataclasses.replace(h, fallback=True).fallback
    for cls in (Series, RawPool, Snapshot, History, ReplicaFloorDecision, Skip, TargetHistory):
        assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"


def test_a_lazy_field_set_by_the_constructor_is_the_instance_s_own() -> None:
    skip = Skip(1.0, "replica_floor", "w", "held", invalid_input=False)
    assert isinstance(Skip.__dict__["reason"], Lazy)
    assert skip.reason == "held" and vars(skip)["reason"] == "held"


def _refused() -> list[type[Any]]:
    @dataclasses.dataclass
    class Mutable:
        x: int

    @dataclasses.dataclass(frozen=True)
    class Posted:
        x: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True)
    class KeywordOnly:
        x: int = dataclasses.field(kw_only=True)

    @dataclasses.dataclass(frozen=True)
    class NotInInit:
        x: int = dataclasses.field(default=0, init=False)

    @dataclasses.dataclass(frozen=True)
    class WithInitVar:
        x: dataclasses.InitVar[int]

    class Plain:
        x: int

    return [Mutable, Posted, KeywordOnly, NotInInit, WithInitVar, Plain]


@pytest.mark.parametrize("cls", _refused(), ids=lambda c: c.__name__)
def test_a_class_whose_instances_would_differ_is_refused(cls: type[Any]) -> None:
    with pytest.raises(TypeError):
        quick_init(cls)
