"""The house: each layer of `sparkfleet/` imports only the layers under it, and no module imports itself
back through a circle. ARCHITECTURE.md's table is this order."""

from __future__ import annotations

import ast
from pathlib import Path

import sparkfleet

PACKAGE = Path(sparkfleet.__file__).resolve().parent
# Bottom to top. The package root (resource paths) and `tables` (one renderer) import nothing of sparkfleet.
LAYERS = ["root", "contract", "model", "release", "host", "controller", "fleet", "cli"]
TOP_MODULES = {"__init__": "root", "tables": "root", "cli": "cli", "__main__": "cli"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    return TOP_MODULES.get(parts[1], parts[1])


def imports(path: Path) -> set[str]:
    """Every sparkfleet module a file imports, at the top or inside a function (a lazy import is still an arrow)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("sparkfleet"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sparkfleet"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                is_module = (PACKAGE.parent / candidate.replace(".", "/")).with_suffix(".py").exists() or \
                    (PACKAGE.parent / candidate.replace(".", "/")).is_dir()
                found.add(candidate if is_module else node.module)
    return found


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def test_every_package_is_a_known_layer():
    assert {layer(m) for m in graph()} <= set(LAYERS)


def test_no_import_runs_back_up():
    upward = sorted(f"{src} ({layer(src)}) -> {dst} ({layer(dst)})"
                    for src, targets in graph().items() for dst in targets
                    if LAYERS.index(layer(dst)) > LAYERS.index(layer(src)))
    assert upward == []


def test_no_circle_between_modules():
    edges = graph()
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[str] = []

    def visit(node: str, trail: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if nxt == node or nxt not in edges:
                continue
            if seen.get(nxt) == 1:
                circles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]) if nxt in trail else nxt)
            elif nxt not in seen:
                visit(nxt, trail + [nxt])
        seen[node] = 2

    for start in sorted(edges):
        if start not in seen:
            visit(start, [start])
    assert circles == []


def test_the_stages_are_imported_by_nothing_in_the_package():
    assert not [m for m, targets in graph().items() for t in targets if t.startswith("sparkfleet.tasks")]
