"""The development tools (`tools/`) import no module of theirs back through a circle (issue 49): the soak's command
sits on top of its decisions and its glue to the fleet, each tool on what it uses. The same reading of every import
(lazy ones too) as tests/unit/test_layers.py's."""

from __future__ import annotations

from pathlib import Path

import tools
from tests.unit.test_layers import circles, graph as package_graph

TOOLS = Path(tools.__file__).resolve().parent


def graph(package: Path = TOOLS) -> dict[str, set[str]]:
    return package_graph(package)


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
