"""Frozen dataclass instances built without their generated `__init__`.

A frozen dataclass's `__init__` sets each field by `object.__setattr__` (its own
`__setattr__` refuses): about a quarter of a microsecond a field. The simulator builds a
pool's and a workload's observation (ten fields each, three series) for every lane at
every tick; `made` sets the same fields in one update of the instance's `__dict__`, which
is all that `__init__` does for the classes it accepts (no `__post_init__`, no slots, no
`InitVar` (those need a `__post_init__`), every field given: checked once per class)."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")

_CHECKED: dict[type, frozenset[str]] = {}


def made(cls: type[T], **values: Any) -> T:
    """`cls(**values)` for a frozen dataclass whose `__init__` only sets its fields:
    every field must be given (ValueError otherwise, or for a class it cannot build)."""
    names = _CHECKED.get(cls)
    if names is None:
        names = _fields(cls)
    if values.keys() != names:
        raise ValueError(f"{cls.__name__}: fields {sorted(names)} expected, got {sorted(values)}")
    obj = object.__new__(cls)
    obj.__dict__.update(values)
    return obj


def _fields(cls: type) -> frozenset[str]:
    params = getattr(cls, "__dataclass_params__", None)
    if (
        params is None
        or not params.frozen
        or hasattr(cls, "__post_init__")
        or "__slots__" in vars(cls)
    ):
        raise ValueError(f"{cls.__name__}: not a frozen dataclass that `made` can build")
    found = frozenset(f.name for f in dataclasses.fields(cls) if f.init)
    if len(found) != len(dataclasses.fields(cls)):
        raise ValueError(f"{cls.__name__}: has fields its __init__ does not set")
    _CHECKED[cls] = found
    return found
