"""A frozen dataclass's field made when first read (issue 20), in a module of its own so
that any core module may use it (decisions.py, which model.py imports, included)."""

from __future__ import annotations


class Lazy:
    """A field of a frozen dataclass made when it is first read (issue 20: the forecast's
    reason and an interval state's pending intervals are made for every series at every
    tick and mostly never read). A maker leaves the field out of the instance's `__dict__`
    and puts `(make, args)` under `_lazy_<field>`; the first read stores `make(*args)` as
    the field (an instance's own value always wins: this descriptor defines no `__set__`),
    so every reader, `==`, `repr` and `dataclasses.replace` see the value the constructor
    would have been given. Set on the class after the dataclass is made."""

    def __init__(self, name: str) -> None:
        self.name, self.key = name, deferred_key(name)

    def __get__(self, obj: object | None, owner: type | None = None) -> object:
        if obj is None:
            return self
        d = obj.__dict__
        found = d.get(self.key)
        if found is None:  # made by another thread meanwhile: set before the maker left
            try:
                return d[self.name]
            except KeyError:
                raise AttributeError(self.name) from None
        make, args = found
        value = make(*args)
        d[self.name] = value
        d.pop(self.key, None)
        return value


def deferred_key(name: str) -> str:
    """Where a maker puts `(make, args)` for the field `name` it leaves to `Lazy`."""
    return f"_lazy_{name}"
