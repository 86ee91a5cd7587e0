"""A frozen dataclass made at a third of the cost (issue 20), in a module of its own so
that any core module may use it (decisions.py, which model.py imports, included)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, TypeVar

T = TypeVar("T")

_SOURCE = "def __init__(self, {args}):\n    _quick_dict = self.__dict__\n{body}\n"


def quick_init(cls: type[T]) -> type[T]:
    """`cls` (a frozen dataclass with a `__dict__`, decorated above `@dataclass`) with an
    `__init__` that stores its fields straight into the instance's `__dict__`, in their
    order: what the dataclass' own does through `object.__setattr__` a field (for a frozen
    one) at about three times the cost, a dozen objects a lane and tick in the what-if
    replay (its observations, signals, snapshot rows and skips).

    The same instances: the same arguments (positional or keyword) and defaults (a
    `default_factory` called when left out), the same `__dict__`; a field's value set on
    the instance, as `object.__setattr__` sets it when the class holds no data descriptor
    of that name (`lazy.Lazy` defines no `__set__`). Refused (TypeError) where it would
    differ: no dataclass, not frozen, slots, a `__post_init__`, an `InitVar`, a field out
    of `__init__` or keyword-only, a data descriptor of a field's name."""
    if not dataclasses.is_dataclass(cls) or "__slots__" in cls.__dict__:
        raise TypeError(f"{cls.__name__}: not a dataclass with a __dict__")
    params = cls.__dict__["__dataclass_params__"]
    if not params.frozen or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: not frozen, or with a __post_init__")
    namespace: dict[str, Any] = {"_quick_missing": dataclasses.MISSING}
    args, body = [], []
    own = cls.__init__.__code__
    names = own.co_varnames[1 : own.co_argcount]
    if own.co_kwonlyargcount or names != tuple(f.name for f in dataclasses.fields(cls)):
        raise TypeError(f"{cls.__name__}: an InitVar, or a field keyword-only or out of __init__")
    for f in dataclasses.fields(cls):
        if hasattr(inspect.getattr_static(cls, f.name, None), "__set__"):
            raise TypeError(f"{cls.__name__}.{f.name}: a data descriptor")
        if f.default is not dataclasses.MISSING:
            namespace[f"_d_{f.name}"] = f.default
            args.append(f"{f.name}=_d_{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_f_{f.name}"] = f.default_factory
            args.append(f"{f.name}=_quick_missing")
            body.append(f"    if {f.name} is _quick_missing:\n        {f.name} = _f_{f.name}()")
        else:
            args.append(f.name)
        body.append(f"    _quick_dict[{f.name!r}] = {f.name}")
    exec(_SOURCE.format(args=", ".join(args), body="\n".join(body)), namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
