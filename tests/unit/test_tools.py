"""The development tools (`tools/`) import no module of theirs back through a circle (issue 49): the soak's command
sits on top of its decisions and its glue to the fleet, each tool on what it uses. The same reading of every import
(lazy ones too) as tests/unit/test_layers.py's."""

from __future__ import annotations

import ast
from pathlib import Path

import tools
from tests.unit.test_layers import module_name

TOOLS = Path(tools.__file__).resolve().parent


def imports(path: Path, package: Path = TOOLS) -> set[str]:
    """Every module of the tools package a file imports, at the top or inside a function."""
    name = package.name
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name == name or a.name.startswith(f"{name}."))
        elif isinstance(node, ast.ImportFrom) and node.module and (node.module + ".").startswith(f"{name}."):
            for alias in node.names:
                candidate = package.parent / f"{node.module}.{alias.name}".replace(".", "/")
                is_module = candidate.with_suffix(".py").exists() or candidate.is_dir()
                found.add(f"{node.module}.{alias.name}" if is_module else node.module)
    return found


def graph(package: Path = TOOLS) -> dict[str, set[str]]:
    return {module_name(p, package): imports(p, package) for p in package.rglob("*.py")}


def circles(edges: dict[str, set[str]]) -> list[str]:
    """Each circle found by a depth-first walk, as `a -> b -> a`."""
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    found: list[str] = []

    def visit(node: str, trail: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if nxt == node or nxt not in edges:
                continue
            if seen.get(nxt) == 1:
                found.append(" -> ".join(trail[trail.index(nxt):] + [nxt]))
            elif nxt not in seen:
                visit(nxt, trail + [nxt])
        seen[node] = 2

    for start in sorted(edges):
        if start not in seen:
            visit(start, [start])
    return found


def test_the_tools_import_no_circle():
    edges = graph()
    assert "tools.soak_fleet" in edges and "tools.soak" in edges["tools.soak_fleet"]  # the graph sees the tools
    assert circles(edges) == []


def test_the_check_sees_a_circle_even_through_a_lazy_import(tmp_path):
    """What tools/soak.py and tools/soak_fleet.py were: the glue imports the decisions, whose command imports the
    glue inside its main()."""
    package = tmp_path / "tools"
    for name, text in {"__init__.py": "", "soak.py": "def main():\n    from tools import soak_fleet\n",
                       "soak_fleet.py": "from tools import soak\n", "bench.py": "import tools.soak\n"}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    edges = graph(package)
    assert edges["tools.bench"] == {"tools.soak"}
    assert circles(edges) == ["tools.soak -> tools.soak_fleet -> tools.soak"]


def test_the_soak_runs_as_documented():
    """`python -m tools.soak` (docs/benchmarks.md, tests/e2e/test_soak.py) is the command on top of both halves."""
    edges = graph()
    assert edges["tools.soak.__main__"] >= {"tools.soak", "tools.soak_fleet"}
    assert "tools.soak_fleet" not in edges["tools.soak"]


def test_every_python_helper_in_files_is_linted():
    """The host helpers are Python without the extension: ruff reads each one only where pyproject.toml lists it
    ([tool.ruff] extend-include), so a new helper is listed there too (`make fast` lints files/)."""
    import tomllib

    root = TOOLS.parent
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["ruff"]["extend-include"])
    helpers = {f"files/{p.name}" for p in (root / "files").iterdir()
               if p.is_file() and not p.suffix and p.read_bytes().startswith(b"#!/usr/bin/env python3")}
    assert helpers and listed == helpers
