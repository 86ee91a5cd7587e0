"""A frozen dataclass made for less (issue 20), in a module of its own so
that any core module may use it (decisions.py, which model.py imports, included)."""

from __future__ import annotations

import dataclasses
import inspect
import types
from typing import Any, TypeVar

T = TypeVar("T")


def quick_init(cls: type[T]) -> type[T]:
    """`cls` (a frozen dataclass, decorated above `@dataclass`) with an `__init__` that
    sets each field as the dataclass' own does, through `object.__setattr__` (or, with
    `slots=True`, the field's slot setter, which `object.__setattr__` calls), without
    looking that function up again a field (a global, then an attribute of `object`, each
    time): about a quarter to a third less a target history (9 fields, slots), less on
    the small ones; a dozen such objects a lane and tick in the what-if replay (its
    observations, signals, snapshot rows, skips and target histories). Not through the
    instance's `__dict__`: asking for it makes a dict the instance then keeps, and every
    attribute read of such an instance costs about three times an inline one (CPython
    3.11: 45 against 13 ns).

    The same instances: the same arguments (positional or keyword) and defaults (a
    `default_factory` called when left out), each field set in order as the dataclass'
    `__init__` sets it. Refused (TypeError) where it would differ: no dataclass, not
    frozen, a `__post_init__`, an `InitVar`, a field out of `__init__` or keyword-only,
    with slots a field without its slot."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__}: not a dataclass")
    if not cls.__dict__["__dataclass_params__"].frozen or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: not frozen, or with a __post_init__")
    own = cls.__init__.__code__
    names = own.co_varnames[1 : own.co_argcount]
    if own.co_kwonlyargcount or names != tuple(f.name for f in dataclasses.fields(cls)):
        raise TypeError(f"{cls.__name__}: an InitVar, or a field keyword-only or out of __init__")
    slotted = "__slots__" in cls.__dict__
    namespace: dict[str, Any] = {"_quick_missing": dataclasses.MISSING, "_set": object.__setattr__}
    args, body = [], []
    for f in dataclasses.fields(cls):
        if slotted:
            found = inspect.getattr_static(cls, f.name, None)
            if not isinstance(found, types.MemberDescriptorType):
                raise TypeError(f"{cls.__name__}.{f.name}: no slot")
            namespace[f"_s_{f.name}"] = found.__set__
            store = f"    _s_{f.name}(self, {f.name})"
        else:
            store = f"    _set(self, {f.name!r}, {f.name})"
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
