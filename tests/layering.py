"""The import-graph checker behind tests/test_layering.py: an AST scan of every import statement in the sources.

`scan(root, sources, generated)` reads each file's imports (top level and inside functions; relative ones
resolved) and resolves each to the module file it names. `layer_violations` lists the imports that run upward or
sideways in `LAYERS`; `import_cycles` lists the file-level import cycles. Both name the file, line and statement.
"""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

# Bottom to top. A package may import its own layer's modules and any lower layer's; a layer whose entry is not
# in SIDEWAYS_OK holds packages that never import each other.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"pdserve"}),
    frozenset({"common"}),
    frozenset({"client"}),
    frozenset({"kv_transfer"}),
    frozenset({"engine"}),
    frozenset({"pod"}),
    frozenset({"router", "prefill_service", "decode_service"}),
    frozenset({"bench", "cli", "autoscaler"}),
)
SIDEWAYS_OK: frozenset[frozenset[str]] = frozenset({frozenset({"bench", "cli", "autoscaler"})})
# Folders that are not packages themselves: `protos/pdserve/...` is the package `pdserve`.
SOURCE_ROOTS = ("protos/",)
EXCLUDED_DIRS = ("tests/", "scripts/")


@dataclass(frozen=True)
class Import:
    """One import statement's reference to a module of the project, as found in `path` at `line`."""

    path: str
    line: int
    statement: str
    target: str  # the module name it resolves to (a scanned file's module, or a name outside the project)

    def where(self) -> str:
        """`path:line: statement`, the form every failure message uses."""
        return f"{self.path}:{self.line}: `{self.statement}`"


@dataclass(frozen=True)
class Project:
    """The scanned sources: module name -> relative path, and every import found in them."""

    modules: dict[str, str]
    imports: tuple[Import, ...]

    def __repr__(self) -> str:
        return f"Project({len(self.modules)} modules, {len(self.imports)} imports)"


def tracked_sources(root: Path) -> tuple[list[str], list[str]]:
    """Git-tracked .py under `root` outside tests/ and scripts/: (the sources, the generated `*_pb2*.py`)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", "*.py"], cwd=root, check=True, capture_output=True, text=True
    ).stdout
    paths = sorted(p for p in listed.split("\0") if p and not p.startswith(EXCLUDED_DIRS))
    generated = [p for p in paths if "_pb2" in PurePosixPath(p).name]
    return [p for p in paths if p not in generated], generated


def module_name(path: str) -> str:
    """`a/b/c.py` -> `a.b.c`, `a/b/__init__.py` -> `a.b`, `protos/pdserve/x.py` -> `pdserve.x`."""
    for source_root in SOURCE_ROOTS:
        path = path.removeprefix(source_root)
    parts = PurePosixPath(path).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def scan(root: Path, paths: list[str], generated: list[str]) -> Project:
    """Parse each of `paths` (relative to `root`) and resolve every import statement in it; `generated` modules
    are import targets only (`from pdserve.v1 import decode_pb2` names that module, not the package)."""
    modules = {module_name(p): p for p in paths}
    known = set(modules) | {module_name(p) for p in generated}
    found: list[Import] = []
    for path in paths:
        tree = ast.parse((root / path).read_text(), filename=path)
        found.extend(_file_imports(path, tree, known))
    return Project(modules=modules, imports=tuple(found))


def _file_imports(path: str, tree: ast.Module, known: set[str]) -> Iterator[Import]:
    """Each distinct module every import statement of `tree` names, in line order."""
    this = module_name(path)
    package = this if path.endswith("__init__.py") else this.rpartition(".")[0]
    nodes = [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]
    for node in sorted(nodes, key=lambda n: (n.lineno, n.col_offset)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = _absolute_base(package, node.level, node.module)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in dict.fromkeys(targets):
            yield Import(path, node.lineno, ast.unparse(node), target)


def _absolute_base(package: str, level: int, module: str | None) -> str:
    """The absolute module a `from` statement names: `from ..x import y` in package `a.b.c` names `a.b.x`."""
    if level == 0:
        return module or ""
    parts = package.split(".")[: len(package.split(".")) - (level - 1)]
    return ".".join([*parts, module] if module else parts)


def layer_of(module: str) -> int | None:
    """Index in `LAYERS` of the module's top-level package; None for a package outside the project."""
    top = module.partition(".")[0]
    return next((i for i, layer in enumerate(LAYERS) if top in layer), None)


def layer_violations(project: Project) -> list[str]:
    """One line per import statement that runs upward, or sideways between packages of a layer that must not mix."""
    found: dict[str, None] = {}
    for imp in project.imports:
        source, target = module_name(imp.path).partition(".")[0], imp.target.partition(".")[0]
        source_layer, target_layer = layer_of(source), layer_of(target)
        if source == target or source_layer is None or target_layer is None or target_layer < source_layer:
            continue
        if target_layer == source_layer and LAYERS[source_layer] in SIDEWAYS_OK:
            continue
        direction = "upward" if target_layer > source_layer else "sideways"
        found[f"{imp.where()}: {source} may not import {target} ({direction})"] = None
    return list(found)


def import_cycles(project: Project) -> list[str]:
    """One line per file-level import cycle (per strongly connected group of files), naming each import in it."""
    edges = _edges(project)
    found = []
    for group in _strongly_connected(sorted(project.modules), edges):
        start = min(group, key=lambda m: project.modules[m])
        if len(group) == 1 and start not in edges.get(start, {}):
            continue
        cycle = _shortest_cycle(start, group, edges)
        line = "import cycle: " + " -> ".join(imp.where() for imp in cycle) + f" -> {project.modules[start]}"
        if len(cycle) < len(group):
            line += " (cycle group: " + ", ".join(sorted(project.modules[m] for m in group)) + ")"
        found.append(line)
    return found


def _edges(project: Project) -> dict[str, dict[str, Import]]:
    """Importer module -> imported module -> the first import statement between them."""
    edges: dict[str, dict[str, Import]] = {}
    for imp in sorted(project.imports, key=lambda i: (i.path, i.line)):
        if imp.target in project.modules:
            edges.setdefault(module_name(imp.path), {}).setdefault(imp.target, imp)
    return edges


def _strongly_connected(nodes: list[str], edges: dict[str, dict[str, Import]]) -> list[set[str]]:
    """Tarjan's strongly connected components of the import graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            cut = stack.index(node)
            groups.append(set(stack[cut:]))
            del stack[cut:]

    for node in nodes:
        if node not in index:
            visit(node)
    return groups


def _shortest_cycle(start: str, group: set[str], edges: dict[str, dict[str, Import]]) -> list[Import]:
    """The imports of a shortest cycle from `start` back to itself inside `group` (breadth first)."""
    paths: dict[str, list[Import]] = {start: []}
    frontier = [start]
    while frontier:
        reached = []
        for node in frontier:
            for nxt, imp in edges.get(node, {}).items():
                if nxt == start:
                    return [*paths[node], imp]
                if nxt in group and nxt not in paths:
                    paths[nxt] = [*paths[node], imp]
                    reached.append(nxt)
        frontier = reached
    raise AssertionError(f"{start} is in no cycle")
