"""A frozen dataclass made at a third of the cost (issue 20), in a module of its own so
that any core module may use it (decisions.py, which model.py imports, included)."""

from __future__ import annotations

import dataclasses
import inspect
import types
from typing import Any, TypeVar

T = TypeVar("T")


def quick_init(cls: type[T]) -> type[T]:
    """`cls` (a frozen dataclass, decorated above `@dataclass`) with an `__init__` that
    stores each field straight into the instance: into its `__dict__`, or through the
    field's slot (`slots=True`). The dataclass' own `__init__` of a frozen class goes
    through `object.__setattr__` a field (a global, an attribute and a call each): about
    three times the cost, at a dozen objects a lane and tick in the what-if replay (its
    observations, signals, snapshot rows, skips and target histories).

    The same instances: the same arguments (positional or keyword) and defaults (a
    `default_factory` called when left out), each field set in order where
    `object.__setattr__` sets it (the instance's `__dict__` when the class holds no data
    descriptor of that name, as `lazy.Lazy` defines no `__set__`; else the slot's).
    Refused (TypeError) where it would differ: no dataclass, not frozen, a
    `__post_init__`, an `InitVar`, a field out of `__init__` or keyword-only, a data
    descriptor of a field's name other than its slot."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__}: not a dataclass")
    if not cls.__dict__["__dataclass_params__"].frozen or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: not frozen, or with a __post_init__")
    own = cls.__init__.__code__
    names = own.co_varnames[1 : own.co_argcount]
    if own.co_kwonlyargcount or names != tuple(f.name for f in dataclasses.fields(cls)):
        raise TypeError(f"{cls.__name__}: an InitVar, or a field keyword-only or out of __init__")
    slotted = "__slots__" in cls.__dict__
    namespace: dict[str, Any] = {"_quick_missing": dataclasses.MISSING}
    args = []
    body = [] if slotted else ["    _quick_dict = self.__dict__"]
    for f in dataclasses.fields(cls):
        found = inspect.getattr_static(cls, f.name, None)
        if slotted and isinstance(found, types.MemberDescriptorType):
            namespace[f"_s_{f.name}"] = found.__set__
            store = f"    _s_{f.name}(self, {f.name})"
        elif slotted or hasattr(found, "__set__"):
            raise TypeError(f"{cls.__name__}.{f.name}: a data descriptor, or no slot")
        else:
            store = f"    _quick_dict[{f.name!r}] = {f.name}"
        if f.default is not dataclasses.MISSING:
            namespace[f"_d_{f.name}"] = f.default
            args.append(f"{f.name}=_d_{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_f_{f.name}"] = f.default_factory
            args.append(f"{f.name}=_quick_missing")
            body.append(f"    if {f.name} is _quick_missing:\n        {f.name} = _f_{f.name}()")
        else:
            args.append(f.name)
        body.append(store)
    source = f"def __init__(self, {', '.join(args)}):\n" + "\n".join(body or ["    pass"])
    exec(source + "\n", namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
