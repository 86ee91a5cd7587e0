"""The code base's shape, checked: no import cycle, no mutable state at module level in
the core, no private name imported from another module, and a generous backstop on the
size of modules and functions (files are split by concept, not by a line cap; the layer
contracts themselves are `make lint`'s import-linter, see tests/core/test_layers.py)."""

from __future__ import annotations
import __future__

import ast
import dataclasses
import functools
import importlib
import inspect
import pkgutil
import re
import types
import typing
from pathlib import Path

import grimp
import numpy as np
import pytest

import gpuscaler.core

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gpuscaler"
GENERATED = ("adapters/kubelet_pb/", "extscaler/pb/")  # grpcio-tools output, not ours to shape
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 100


def _sources() -> list[Path]:
    return [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if not any(g in p.relative_to(PACKAGE).as_posix() for g in GENERATED)
    ]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b"}, "b": set()}, []),
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"a"}}, []),
    ],
)
def test_the_cycle_finder_finds_exactly_the_cycles(
    edges: dict[str, set[str]], expected: list[list[str]]
) -> None:
    assert cycles(edges) == expected


def test_no_module_of_gpuscaler_imports_itself_back_even_for_types_only() -> None:
    graph = grimp.build_graph("gpuscaler", exclude_type_checking_imports=False)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert cycles(edges) == []


def test_no_module_is_over_800_lines() -> None:
    long = {
        p.relative_to(ROOT).as_posix(): n
        for p in _sources()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_function_is_over_100_lines() -> None:
    long = {}
    for p in _sources():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(ROOT).as_posix()}:{node.lineno} {node.name}"] = n
    assert long == {}


def test_no_private_name_is_imported_from_another_module() -> None:
    crossing = [
        f"{p.relative_to(ROOT).as_posix()}:{node.lineno} {alias.name} from {node.module}"
        for p in _sources()
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpuscaler")
        for alias in node.names
        if alias.name.startswith("_")
    ]
    assert crossing == []


def immutable(value: object) -> bool:
    """Whether a module-level value can never change: a scalar, a string, a compiled
    pattern, a read-only array, a mapping proxy, a tuple or frozenset of such, a frozen
    dataclass of such, or a type, function or alias (a cached function keeps state)."""
    scalars = (int, float, complex, str, bytes, bool, type(None), range, re.Pattern)
    if isinstance(value, (*scalars, __future__._Feature)):
        return True
    if isinstance(value, functools._lru_cache_wrapper):
        return False
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        frozen = type(value).__dataclass_params__.frozen  # type: ignore[attr-defined]
        return bool(frozen) and all(
            immutable(getattr(value, f.name)) for f in dataclasses.fields(value)
        )
    if isinstance(value, np.ndarray):
        return not value.flags.writeable and value.dtype != object
    if isinstance(value, tuple | frozenset):
        return all(immutable(v) for v in value)
    if isinstance(value, types.MappingProxyType):
        return all(immutable(v) for v in value.values())
    return (
        inspect.isclass(value)
        or callable(value)
        or isinstance(value, typing.TypeVar | types.GenericAlias | types.UnionType)
        or type(value).__module__ == "typing"
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ((1, "a", (2.0, None)), True),
        (frozenset({1, 2}), True),
        (types.MappingProxyType({"a": 1}), True),
        ([1], False),
        ({"a": 1}, False),
        ((1, [2]), False),
        (np.zeros(2), False),
        (np.zeros(2).view(), False),
        (functools.cache(lambda: 1), False),
        (re.compile("a"), True),
    ],
)
def test_the_immutability_check_tells_constants_from_state(value: object, expected: bool) -> None:
    assert immutable(value) is expected


def test_the_core_keeps_no_mutable_state_at_module_level() -> None:
    """Every value a core module binds at its top level is a constant: the core's
    functions see only their arguments, so the same inputs give the same plan."""
    found = []
    for info in pkgutil.walk_packages(gpuscaler.core.__path__, "gpuscaler.core."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if name.startswith("__") or inspect.ismodule(value):
                continue
            if not immutable(value):
                found.append(f"{info.name}.{name}: {type(value).__name__}")
    assert found == []
