"""The layout rule of the project's two Python packages (the shipped vendored_flash_attn, the build's
cmake/vfa_build): folders by concern, each folder's __init__.py only its docstring, imports only
down a declared order of layers, no circle of files or of folders. Read from the sources' text
(ast), nothing imported; tests/unit/test_package.py holds both packages to it."""

from __future__ import annotations

import ast
from typing import Sequence


def _module_names(sources: dict[str, str]) -> dict[str, str]:
    """Dotted name (below the package) of each source path (relative to the package)."""
    names = {}
    for path in sources:
        parts = path[:-len(".py")].split("/")
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        names[path] = ".".join(parts)
    return names


def import_edges(sources: dict[str, str], package: str) -> set[tuple[str, str]]:
    """(importer, imported) dotted names below the package, for every import of a module of the
    package anywhere in a file (lazy ones in functions too) and the root's lazy exports (a dict
    named _EXPORTS in the root's __init__.py). The package root itself is "__init__"."""
    names = _module_names(sources)
    known = set(names.values())
    edges = set()

    def target(dotted: list[str]) -> str:
        name = ".".join(dotted) or "__init__"
        return name if name in known or name == "__init__" else ".".join(dotted[:-1]) or "__init__"

    for path, text in sources.items():
        me = names[path]
        here = me.split(".") if path.endswith("__init__.py") and me != "__init__" else me.split(".")[:-1]
        if me == "__init__":
            here = []
        tree = ast.parse(text, path)
        for node in ast.walk(tree):
            found = []
            if isinstance(node, ast.Import):
                found = [a.name.split(".")[1:] for a in node.names if a.name.split(".")[0] == package]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
                    module = base + (node.module.split(".") if node.module else [])
                elif node.module and node.module.split(".")[0] == package:
                    module = node.module.split(".")[1:]
                else:
                    continue
                found = [module + [a.name] for a in node.names]
            if me == "__init__" and isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets):
                found = [v.value.split(".") + ["?"] for v in node.value.values]
            edges |= {(me, t) for t in map(target, found) if t != me}
    return edges


def _unit(module: str) -> str:
    return module.split(".")[0]


def _cycle(edges: set[tuple[str, str]]) -> list[str]:
    """One circle of the graph, [] when there is none."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        stack.pop()
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def layout_problems(sources: dict[str, str], package: str, layers: Sequence[Sequence[str]],
                    root_at_most: int) -> list[str]:
    """What breaks a package's layout: more than root_at_most modules at its root, a module in
    no layer (a layer is a folder of the package or a module of its root, listed top to bottom),
    a folder's __init__.py holding more than its docstring, an import up the layers, a circle of
    files or of folders (a module of the root counts as a folder of its own)."""
    found = []
    names = _module_names(sources)

    def layer(module: str) -> int:
        return next(i for i, units in enumerate(layers) if _unit(module) in units)

    root = sorted(p for p in sources if "/" not in p)
    if len(root) > root_at_most:
        found.append(f"the package root holds {len(root)} modules (at most {root_at_most}): {root}")
    for path, module in names.items():
        if not any(_unit(module) in units for units in layers):
            found.append(f"{path}: in no layer of LAYERS")
        if path.endswith("/__init__.py"):
            body = ast.parse(sources[path]).body
            if len(body) != 1 or not isinstance(body[0], ast.Expr) or not isinstance(body[0].value, ast.Constant):
                found.append(f"{path}: a folder's __init__.py holds only its docstring")
    if found:
        return found
    edges = import_edges(sources, package)
    found += [f"{a} imports {b}, a layer above it" for a, b in sorted(edges) if layer(a) > layer(b)]
    if cycle := _cycle(edges):
        found.append("a circle of files: " + " -> ".join(cycle))
    folder = {name: path.rsplit("/", 1)[0].replace("/", ".") if "/" in path else name for path, name in names.items()}
    folder["__init__"] = "__init__"
    if cycle := _cycle({(folder[a], folder[b]) for a, b in edges if folder[a] != folder[b]}):
        found.append("a circle of folders: " + " -> ".join(cycle))
    return found


def package_sources(directory) -> dict[str, str]:
    """Every .py file below a package's folder, by its path relative to the folder."""
    return {p.relative_to(directory).as_posix(): p.read_text(encoding="utf-8")
            for p in sorted(directory.rglob("*.py")) if "__pycache__" not in p.parts}
