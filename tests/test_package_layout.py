"""The package reads as the pipeline: stages import only downwards (the layers contract in pyproject.toml,
checked by `lint-imports` in CI and here), no import cycle, small modules, thin command files, no `assert`
standing in for input checks, and every import inside a function says why it is deferred."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "shardscope"
MODULES = sorted(PACKAGE.rglob("*.py"))
# The front ends: the library (`shardscope`), the pytest plugin and the library's pandas groupings.
FRONT_ENDS = {"shardscope", "shardscope.pytest_plugin", "shardscope.tables"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_layers_contract_holds():
    lint_imports = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    result = subprocess.run([lint_imports], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "2 kept, 0 broken" in result.stdout


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_takes_part_in_an_import_cycle():
    # Imports under TYPE_CHECKING never run; every other import (in functions too) counts.
    graph = grimp.build_graph("shardscope", exclude_type_checking_imports=True)
    edges = {module: set(graph.find_modules_directly_imported_by(module)) for module in graph.modules}
    # A package's own __init__ importing its modules is how it exports them, not a cycle.
    for module, imported in edges.items():
        edges[module] = {m for m in imported if not m.startswith(module + ".")}
    assert strongly_connected(edges) == []


def test_the_cycle_finder_finds_a_cycle():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_nothing_inside_imports_the_front_ends():
    offenders = []
    for path in MODULES:
        name = module_name(path)
        if name in FRONT_ENDS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module in FRONT_ENDS:
                offenders.append(f"{name}: from {node.module} import …")
            if isinstance(node, ast.Import) and any(alias.name in FRONT_ENDS for alias in node.names):
                offenders.append(f"{name}: import {', '.join(a.name for a in node.names)}")
    assert offenders == []


def test_the_tree_is_folders_of_small_modules():
    top_level = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top_level) <= 8, top_level
    long = {module_name(p): n for p in MODULES if (n := len(p.read_text(encoding="utf-8").splitlines())) > 450}
    assert long == {}
    commands = {p.name: n for p in (PACKAGE / "cli").glob("*.py") if (n := len(p.read_text().splitlines())) >= 200}
    assert commands == {}


def test_no_assert_stands_in_for_an_input_check():
    asserts = [
        f"{module_name(path)}:{node.lineno}"
        for path in MODULES
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Assert)
    ]
    assert asserts == []


def deferred_imports(path: Path) -> list[tuple[int, bool]]:
    """(line, marked) of every import inside a function: marked when its run of imports carries a
    `# lazy: why` comment (on one of its lines, or on the line just above the run)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found = []
    for function in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            start = node.lineno - 1
            # Walk up through the run of import lines (their continuation lines, and the blank lines that
            # separate groups of imports) this one belongs to.
            while start > 0:
                above = start - 1
                while above > 0 and not lines[above].strip():
                    above -= 1
                if not lines[above].strip().startswith(("from ", "import ", ")", "# lazy")):
                    break
                start = above
            run = lines[start : node.end_lineno]
            found.append((node.lineno, any("# lazy:" in line for line in run)))
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_deferred_import_says_why(path):
    unmarked = [line for line, marked in deferred_imports(path) if not marked]
    assert unmarked == [], f"{path.relative_to(ROOT)}: imports inside functions without `# lazy: why` at {unmarked}"


def test_the_marker_check_tells_marked_from_unmarked(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "def f():\n    import json  # lazy: why\n    from os import path\n    return json, path\n\n"
        "def g():\n    x = 1\n    import json\n    return json, x\n"
    )
    assert deferred_imports(source) == [(2, True), (3, True), (8, False)]
