"""The code base's shape, checked: no import cycle, no module over 450 lines, no
function over 60, no private name imported from another module (issue 19; the layer
contracts themselves are `make lint`'s import-linter, see tests/test_layers.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpuscaler"
GENERATED = ("adapters/kubelet_pb/", "extscaler/pb/")  # grpcio-tools output, not ours to shape
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


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


def test_no_module_is_over_450_lines() -> None:
    long = {
        p.relative_to(ROOT).as_posix(): n
        for p in _sources()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_function_is_over_60_lines() -> None:
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
