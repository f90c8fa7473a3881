"""The package's modules import downward: no import cycle among omni_hf's modules, imports inside functions
included, and the CUDA library's layer (`omni_hf.kernels`) under both `omni_hf.mask` and `omni_hf.ops`.

Read from the sources with ast (nothing is imported): every ``import`` / ``from ... import`` anywhere in a module,
relative ones resolved against its package. Importing ``a.b.c`` runs the ``__init__`` of ``a.b`` first, so an edge
also goes to each package above the target that is not already above the importing module (a module always runs
inside its own packages' initialisation)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "omni_hf"


def module_files() -> dict[str, Path]:
    """Every module of omni_hf by dotted name (a package by its name, from its __init__.py)."""
    modules = {}
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_names(module: str, path: Path) -> set[str]:
    """The dotted names a module imports anywhere in its body (absolute, relative ones resolved); for ``from X
    import y`` both ``X`` and ``X.y`` (the latter counts where it is a module)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph() -> dict[str, set[str]]:
    """Module -> the omni_hf modules (and packages) whose import it runs."""
    files = module_files()
    graph = {}
    for module, path in files.items():
        own = set(ancestors(module))
        edges = set()
        for name in imported_names(module, path):
            if name not in files:
                continue
            edges.update(m for m in [*ancestors(name), name] if m in files and m not in own and m != module)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (Tarjan), as a path that
    returns to its start."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                connect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return [cycle_in(graph, component) for component in components]


def cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component (breadth first)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while start not in came_from:
        next_frontier = []
        for node in frontier:
            for succ in sorted(graph[node] & component):
                if succ not in came_from:
                    came_from[succ] = node
                    next_frontier.append(succ)
        frontier = next_frontier
    path = [start]
    while len(path) == 1 or path[-1] != start:
        path.append(came_from[path[-1]])
    return path[::-1]


def test_the_reader_resolves_relative_and_function_level_imports(tmp_path):
    source = tmp_path / "spec.py"
    source.write_text("from . import lists\nfrom ..ops.library import forward\n\n\ndef f():\n"
                      "    from .types import BlockType\n    import omni_hf.build\n")
    assert imported_names("omni_hf.mask.spec", source) == {
        "omni_hf.mask", "omni_hf.mask.lists", "omni_hf.ops.library", "omni_hf.ops.library.forward",
        "omni_hf.mask.types", "omni_hf.mask.types.BlockType", "omni_hf.build"}
    graph = import_graph()
    assert {"omni_hf.kernels", "omni_hf.kernels.token_mask"} <= graph["omni_hf.mask.block_mask"]
    assert "omni_hf.mask" not in graph["omni_hf.mask.block_mask"]  # its own package: initialised before it runs
    assert {"omni_hf.ops.library", "omni_hf.ops.reference"} <= graph["omni_hf.ops.attention"]


def test_cycles_are_found_and_printed_as_paths():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b", "c"}, "b": {"a"}, "c": set()}) == [["a", "b", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_the_packages_modules():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in found)


def test_the_library_layer_sits_under_mask_and_ops():
    graph = import_graph()
    for module, edges in graph.items():
        if module.startswith("omni_hf.kernels") or module == "omni_hf.build":
            assert not {e for e in edges if e.startswith(("omni_hf.mask", "omni_hf.ops"))}, module
        if module.startswith("omni_hf.mask"):
            assert not {e for e in edges if e.startswith("omni_hf.ops")}, module
