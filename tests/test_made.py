"""Frozen dataclasses built by `gpuscaler.sim.made` (issue 20: a lockstep's observation of
every lane, every tick) are what their `__init__` builds: the same fields and values, the
same equality, hash and repr; classes it cannot build are refused; and a cluster's
signals built that way are the signals built by the dataclasses' own `__init__`."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import numpy as np
import pytest
from test_lanes import _clusters

from gpuscaler.core.model import Series
from gpuscaler.core.snapshot import RawPool, RawWorkload
from gpuscaler.sim.cluster import SimulatedCluster
from gpuscaler.sim.made import made


@dataclasses.dataclass(frozen=True)
class Point:
    x: float
    y: float = 0.0
    tags: tuple[str, ...] = dataclasses.field(default_factory=tuple)


@dataclasses.dataclass(frozen=True, slots=True)
class Slotted:
    x: float


@dataclasses.dataclass
class Mutable:
    x: float


@dataclasses.dataclass(frozen=True)
class Checked:
    x: float

    def __post_init__(self) -> None:
        if self.x < 0:
            raise ValueError("negative")


@dataclasses.dataclass(frozen=True)
class Derived:
    x: float
    twice: float = dataclasses.field(init=False, default=0.0)


VALUES: list[dict[str, Any]] = [
    {"x": 1.5, "y": -0.0, "tags": ("a",)},
    {"x": float("nan"), "y": 2.0, "tags": ()},
    {"x": -3.0, "y": float("inf"), "tags": ("b", "c")},
]


@pytest.mark.parametrize("values", VALUES)
def test_an_instance_made_has_the_fields_and_behaviour_of_one_built_by_init(
    values: dict[str, Any],
) -> None:
    got, want = made(Point, **values), Point(**values)
    assert vars(got) == vars(want) or values["x"] != values["x"]  # NaN != NaN
    assert repr(got) == repr(want)
    assert hash(got) == hash(want)
    assert (got == want) == (want == want)
    assert pickle.loads(pickle.dumps(got)).__dict__.keys() == vars(want).keys()
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.x = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "cls", [Slotted, Mutable, Checked, Derived, dict], ids=lambda c: c.__name__
)
def test_classes_whose_init_does_more_than_set_the_fields_are_refused(cls: type) -> None:
    with pytest.raises(ValueError, match=r"can build|does not set"):
        made(cls, x=1.0)


@pytest.mark.parametrize("given", [{"x": 1.0}, {"x": 1.0, "y": 2.0, "tags": (), "z": 3}])
def test_a_field_left_out_or_one_too_many_is_refused(given: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="expected"):
        made(Point, **given)


def built_by_init(c: SimulatedCluster, name: str | None) -> tuple[RawPool, RawWorkload]:
    """`SimulatedCluster.signals` as it was before `made` (the oracle)."""
    end = c.cursor
    begin = max(0, end - c.window_slots)
    start, step, rec = c.start + c.slot * begin, c.slot, c.rec
    held = slice(begin - c.signals_from, end - c.signals_from)
    pool = RawPool(
        name=name or c.pool_name,
        utilization=Series(start=start, step=step, values=rec.pool_util[held]),
        stall=Series(start=start, step=step, values=rec.stall[held]),
        fragments=c.fragments,
        time_slice_level=c.time_slice_level,
        gpu_memory_gib=c.gpu_memory_gib,
        max_shares_held=0,
        gpus_held=int(c.rec.gpus[c.cursor - 1]) if c.cursor else None,
    )
    workload = RawWorkload(
        key=c.workload_key,
        load=Series(start=start, step=step, values=rec.demand_pct[begin:end]),
        floor=c.floor,
        replicas=c.spec_count(),
        max_replicas=c.replicas_cfg.max_replicas,
        replica_gpu_share=c.share(),
    )
    return pool, workload


def same(got: object, want: object) -> None:
    """The same fields, series to the last bit and by start and step."""
    assert type(got) is type(want)
    assert vars(got).keys() == vars(want).keys()
    for k, v in vars(want).items():
        g = getattr(got, k)
        if isinstance(v, Series):
            assert (g.start, g.step) == (v.start, v.step)
            assert g.values.tobytes() == v.values.tobytes() and g.values.shape == v.values.shape
        else:
            assert g == v and type(g) is type(v), k


@pytest.mark.parametrize("name", [None, "lane-3"])
def test_a_clusters_signals_are_the_ones_its_dataclasses_init_builds(name: str | None) -> None:
    clusters = _clusters("10s", 4, 1.0, 7)
    rng = np.random.default_rng(5)
    for c in clusters:
        for t in (c.start, c.start + 600.0, c.start + 3000.0):
            c.advance_to(t)
            c.floor = int(rng.integers(0, 5))
            c.set_replicas(t, max(c.floor, c.spec_count()))
            c.fragments = int(rng.choice([1, 2, 4]))
            for got, want in zip(c.signals(name), built_by_init(c, name), strict=True):
                same(got, want)
