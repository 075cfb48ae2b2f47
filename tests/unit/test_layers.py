"""The house: each layer of `sparkfleet/` imports only the layers under it, and no module imports itself
back through a circle. ARCHITECTURE.md's table is this order."""

from __future__ import annotations

import ast
from pathlib import Path

import sparkfleet

PACKAGE = Path(sparkfleet.__file__).resolve().parent
# Bottom to top. The package root (resource paths), `tables` (one renderer) and `refused` (the one refusal) import
# nothing of sparkfleet; the command line is `cli` and its modules, one per command (`commands`); the
# stages (`tasks`) and the deploy files that run them (`deploys`) sit on top: the fleet commands load deploy files
# by path, and nothing else in the package imports them.
LAYERS = ["root", "contract", "model", "release", "roles", "host", "controller", "fleet", "cli", "stages"]
TOP_MODULES = {"__init__": "root", "tables": "root", "refused": "root", "cli": "cli", "__main__": "cli",
               "commands": "cli", "tasks": "stages", "deploys": "stages", "quality": "model"}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "root"
    return TOP_MODULES.get(parts[1], parts[1])


def imports(path: Path, package: Path = PACKAGE) -> set[str]:
    """Every module of `package` (sparkfleet, or tools/) a file imports, at the top or inside a function (a lazy
    import is still an arrow)."""
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


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    return {module_name(p, package): imports(p, package) for p in package.rglob("*.py")}


def upward(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{src} ({layer(src)}) -> {dst} ({layer(dst)})" for src, targets in edges.items()
                  for dst in targets if LAYERS.index(layer(dst)) > LAYERS.index(layer(src)))


def test_every_package_is_a_known_layer():
    assert {layer(m) for m in graph()} <= set(LAYERS)


def test_no_import_runs_back_up():
    assert upward(graph()) == []


def test_the_check_sees_an_upward_import_even_a_lazy_one(tmp_path):
    package = tmp_path / "sparkfleet"
    for name, text in {"__init__.py": "", "contract/__init__.py": "", "contract/paths.py": "",
                       "fleet/__init__.py": "from sparkfleet.contract import paths\n",
                       "fleet/rollout.py": "",
                       "contract/settings.py": "from sparkfleet.fleet import rollout\n",
                       "cli.py": "def main():\n    from sparkfleet.tasks import converge\n",
                       "tasks/__init__.py": "from sparkfleet.fleet.rollout import x\n"}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    assert upward(graph(package)) == ["sparkfleet.cli (cli) -> sparkfleet.tasks (stages)",
                                      "sparkfleet.contract.settings (contract) -> sparkfleet.fleet.rollout (fleet)"]


def circles(edges: dict[str, set[str]]) -> list[str]:
    """Each circle a depth-first walk of the import graph finds, as `a -> b -> a`."""
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    found: list[str] = []

    def visit(node: str, trail: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if nxt == node or nxt not in edges:
                continue
            if seen.get(nxt) == 1:
                found.append(" -> ".join(trail[trail.index(nxt):] + [nxt]) if nxt in trail else nxt)
            elif nxt not in seen:
                visit(nxt, trail + [nxt])
        seen[node] = 2

    for start in sorted(edges):
        if start not in seen:
            visit(start, [start])
    return found


def test_no_circle_between_modules():
    assert circles(graph()) == []


def test_the_deploy_files_are_imported_by_nothing():
    """A deploy file runs its stages when executed: pyinfra executes it once per host, an import would run it once."""
    assert not [m for m, targets in graph().items() for t in targets if t.startswith("sparkfleet.deploys.")]


def test_the_stages_import_nothing_of_the_fleet_commands():
    """The stages ensure what `roles/` and `release/` plan; `fleet/` talks to a live fleet and sits beside them."""
    assert sorted(f"{m} -> {t}" for m, targets in graph().items() if layer(m) == "stages"
                  for t in targets if layer(t) == "fleet") == []
