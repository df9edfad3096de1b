"""The layers of sft_grid (sft_grid/__init__.py) hold: every import, function-local ones included, goes down the
layers; no two modules import each other in a cycle; code that runs in a backend's virtual environment imports
nothing of sft_grid; the schedulers import only the core; no two modules share a name (a name says what a module is
about, once)."""

from __future__ import annotations

import ast
from itertools import pairwise
from pathlib import Path

import pytest

from sft_grid.core.paths import REPO_ROOT

PACKAGE = REPO_ROOT / "sft_grid"
# layer -> the layers it may import (itself included); the order is the one the package docstring gives
LAYERS = [
    "core",
    "planning",
    "backends",
    "checks",
    "stages",
    "job",
    "schedulers",
    "sites",
    "analysis",
    "adaptive",
    "grid",
    "cli",
]
MAY_IMPORT = {layer: set(LAYERS[: i + 1]) for i, layer in enumerate(LAYERS)}
# the schedulers execute a plan and read the queue: they need the core's types and nothing else
MAY_IMPORT["schedulers"] = {"core", "schedulers"}
# the job side imports what a job needs, never the grid's or the schedulers' code
MAY_IMPORT["job"] = {"core", "planning", "backends", "checks", "stages", "job"}


def module_name(path: Path, root: Path = REPO_ROOT) -> str:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "hydra_plugins":
        return "cli"
    if len(parts) == 1 or parts[1] not in [*LAYERS, "in_venv"]:
        return "cli"  # sft_grid itself and its top-level modules are the entry points
    return parts[1]


def imports_of(path: Path, root: Path = REPO_ROOT) -> list[tuple[str, int]]:
    """Every sft_grid module this file imports (module level or inside a function), with the line."""
    tree = ast.parse(path.read_text(), str(path))
    me = module_name(path, root)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{me}: relative import (the layers are read from absolute ones)"
            module = node.module or ""
            found.append((module, node.lineno))
            # `from sft_grid.x import y` may import the module sft_grid.x.y
            found += [(f"{module}.{alias.name}", node.lineno) for alias in node.names]
    return [(m, line) for m, line in found if m.split(".")[0] in ("sft_grid", "hydra_plugins")]


def sources() -> list[Path]:
    return sorted([*PACKAGE.rglob("*.py"), *(REPO_ROOT / "hydra_plugins").rglob("*.py")])


def known_modules() -> set[str]:
    return {module_name(p) for p in sources()}


def graph() -> dict[str, set[str]]:
    known = known_modules()
    return {module_name(p): {m for m, _ in imports_of(p) if m in known and m != module_name(p)} for p in sources()}


def upward_imports(files: list[tuple[Path, Path]]) -> list[str]:
    """The imports that go up a layer among `files`, each (path, the root its module name is read from)."""
    known = {module_name(p, root) for p, root in files}
    upward = []
    for path, root in files:
        me = module_name(path, root)
        mine = layer_of(me)
        for module, line in imports_of(path, root):
            if module not in known or module == "sft_grid":
                continue
            theirs = layer_of(module)
            where = f"{path.relative_to(root)}:{line}"
            if mine == "in_venv" or theirs == "in_venv":
                if mine == "in_venv" and theirs != "in_venv":
                    upward.append(f"{where} imports {module} (in_venv imports no sft_grid)")
                continue
            if theirs not in MAY_IMPORT[mine]:
                upward.append(f"{where} ({mine}) imports {module} ({theirs})")
    return upward


def test_imports_go_down_the_layers():
    upward = upward_imports([(p, REPO_ROOT) for p in sources()])
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


def test_no_import_cycles():
    edges = graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt] if nxt in stack else [node, nxt])
            elif not state.get(nxt):
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for node in sorted(edges):
        if not state.get(node):
            visit(node, [node])
    # a package's __init__ importing its own modules is not a cycle of meaning: drop those edges' echoes
    real = [c for c in cycles if not any(a.startswith(b + ".") or b.startswith(a + ".") for a, b in pairwise(c))]
    assert not real, "import cycles:\n" + "\n".join(" -> ".join(c) for c in real)


def test_the_checker_sees_function_local_imports(tmp_path):
    """The checker itself: an import inside a function counts like one at the top, and an upward one fails. The
    probe is a module of a copy of the package's layout under tmp_path, never written into the package (a test
    beside it, on another worker, would read it)."""
    fake = tmp_path / "sft_grid" / "core" / "_layer_probe.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("def f():\n    from sft_grid.grid import flow\n")
    assert module_name(fake, tmp_path) == "sft_grid.core._layer_probe"
    assert [m for m, _ in imports_of(fake, tmp_path)] == ["sft_grid.grid", "sft_grid.grid.flow"]
    found = upward_imports([*((p, REPO_ROOT) for p in sources()), (fake, tmp_path)])
    assert found == [
        "sft_grid/core/_layer_probe.py:2 (core) imports sft_grid.grid (grid)",
        "sft_grid/core/_layer_probe.py:2 (core) imports sft_grid.grid.flow (grid)",
    ], found


@pytest.mark.parametrize("layer", LAYERS[:-1])
def test_each_layer_says_what_it_is(layer):
    doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text()))
    assert doc and doc.lower().startswith(f"layer {LAYERS.index(layer)}, {layer}"), doc


def test_no_two_modules_share_a_name():
    by_name: dict[str, list[str]] = {}
    for p in PACKAGE.rglob("*.py"):
        if p.stem not in ("__init__", "__main__"):
            by_name.setdefault(p.stem, []).append(str(p.relative_to(REPO_ROOT)))
    shared = {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1}
    assert not shared, f"modules that share a name: {shared}"
