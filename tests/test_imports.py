"""The library's modules import each other without a circle, at the top of a module or inside a function
(issue 47 item 4): a reader can follow any module's dependencies top-down."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """{module: the bftrec modules it imports anywhere in its file}. ``from a.b import c`` counts as an edge to
    ``a.b.c`` when that is a module, else to ``a.b``."""
    files = {_module(p): p for p in (ROOT / "bftrec").rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                         for a in node.names]
            graph[mod] |= {n for n in names if n in files and n != mod}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (c := visit(n)):
                return c
        state[m] = 2
        stack.pop()
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_no_import_circle_among_the_library_modules():
    graph = import_graph()
    assert "bftrec.models.blocks" in graph["bftrec.models.sasrec"]  # the graph sees real edges
    cycle = find_cycle(graph)
    assert cycle is None, f"import circle: {' -> '.join(cycle)}"


def test_the_cycle_finder_finds_a_planted_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("name", ["bert4rec", "hstu"])
def test_backbones_share_blocks_through_one_module(name):
    deps = import_graph()[f"bftrec.models.{name}"]
    assert "bftrec.models.blocks" in deps and "bftrec.models.sasrec" not in deps
