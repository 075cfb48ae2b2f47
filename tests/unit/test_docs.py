"""The README and docs/ stay true to the code: the settings reference is group_data/all.py's, every relative link
lands, and the README stays a front door."""

from __future__ import annotations

import re
from pathlib import Path

from markdown_it import MarkdownIt

from sparkfleet.contract.settings import SECRET_SETTINGS
from tools import settings_reference
from tools.settings_reference import DEFAULTS_FILE, REFERENCE_FILE, generate, parse, render

from .helpers import DEFAULTS, ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_MD = MarkdownIt("commonmark").enable("table")


def _tokens(page: Path):
    for token in _MD.parse(page.read_text()):
        yield token
        yield from token.children or ()


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    tokens = list(_MD.parse(page.read_text()))
    return {_slug(tokens[i + 1].content) for i, t in enumerate(tokens) if t.type == "heading_open"}


def _code_blocks(page: Path) -> list[str]:
    return [t.content for t in _MD.parse(page.read_text()) if t.type in ("fence", "code_block")]


def test_the_settings_reference_is_the_one_generated_from_the_defaults():
    """Edit group_data/all.py's comments, then `python -m tools.settings_reference`: the two never drift."""
    assert REFERENCE_FILE.read_text() == generate(), "run: python -m tools.settings_reference"


def test_the_reference_describes_every_setting_in_the_defaults_order():
    """A setting added to group_data/all.py without a comment saying what it does fails here."""
    settings = [s for section in parse(DEFAULTS_FILE.read_text()) for s in section.settings]
    assert [s.name for s in settings] == list(DEFAULTS)
    assert [s.name for s in settings if not s.description.strip()] == []


def test_the_secrets_flagged_are_the_settings_the_code_keeps_secret():
    settings = [s for section in parse(DEFAULTS_FILE.read_text()) for s in section.settings]
    assert {s.name for s in settings if s.secret} == SECRET_SETTINGS
    assert "| `api_key` **secret** | `None` |" in REFERENCE_FILE.read_text()


def test_the_shape_of_a_defaults_file():
    source = '''"""Docstring # not a comment."""
early = 1  # before any header

# --- Model: where it comes from -------------
# said above, for the next one
repo = "a|b"  # the repository
source = "peer"  # "hub": each host; "peer": one host,
#                  the others from it over the LAN
token = None  # secret: root-only on the host
# said above the block
table = {
    "x": 1,
}
plain = 3
'''
    [first, model] = parse(source)
    assert (first.title, [(s.name, s.default, s.description) for s in first.settings]) == (
        "Settings", [("early", "1", "before any header")])
    assert model.title == "Model: where it comes from"
    rows = {s.name: s for s in model.settings}
    assert rows["repo"].description == "the repository. said above, for the next one"
    assert rows["source"].description == '"hub": each host; "peer": one host, the others from it over the LAN'
    assert (rows["token"].secret, rows["token"].description) == (True, "root-only on the host")
    assert (rows["table"].default, rows["table"].description) == ('{ "x": 1, }', "said above the block")
    assert rows["plain"].description == "" and not rows["plain"].secret
    text = render([model])
    assert '| `repo` | `"a\\|b"` |' in text and "| `token` **secret** | `None` |" in text


def test_check_mode_says_when_the_committed_reference_is_stale(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "settings-reference.md"
    monkeypatch.setattr(settings_reference, "REFERENCE_FILE", stale)
    monkeypatch.setattr(settings_reference, "ROOT", tmp_path)
    stale.write_text(generate().replace("`8000`", "`9000`"))
    assert settings_reference.main(["--check"]) == 1
    assert "out of date: run python -m tools.settings_reference" in capsys.readouterr().err
    assert settings_reference.main([]) == 0 and settings_reference.main(["--check"]) == 0
    assert stale.read_text() == generate()


def test_every_relative_link_lands():
    """Links between README.md, docs/ and the repository's files name files that exist (and headings, with #)."""
    broken = []
    for page in PAGES:
        for token in _tokens(page):
            href = token.attrs.get("href") if token.type == "link_open" else None
            if not href or re.match(r"[a-z][a-z0-9+.-]*:", href):
                continue
            path, _, anchor = href.partition("#")
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}: {href}")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                broken.append(f"{page.relative_to(ROOT)}: {href} (no such heading)")
    assert broken == []


def test_every_docs_page_is_in_the_index():
    index = (ROOT / "docs" / "README.md").read_text()
    assert [p.name for p in PAGES[1:] if p.name != "README.md" and f"]({p.name})" not in index] == []


def test_the_readme_is_a_front_door():
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) < 250
    commands = "\n".join(_code_blocks(readme))
    for command in ("make demo", "make test", "pip install .", "sparkfleet init office --host spark-1=",
                    "sparkfleet users add inventory.py alice", "sparkfleet plan inventory.py",
                    "pyinfra inventory.py deploy.py", "sparkfleet status inventory.py",
                    "sparkfleet rollout inventory.py --batch 1"):
        assert command in commands, command


def test_every_make_target_shown_exists():
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    shown = {m for page in PAGES for block in _code_blocks(page) for m in re.findall(r"\bmake ([a-z][\w-]*)", block)}
    assert shown and shown - targets == set()


def test_no_page_shows_a_secret_written_into_a_file():
    """api_key, hub_token and users' keys come from a file outside the project, never a literal in an example."""
    literal = re.compile(r"""\b(api_key|hub_token|front_door_users|front_door_viewers)"?\s*[:=]\s*["'{]""")
    assert [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in PAGES for block in _code_blocks(p)
            for m in literal.finditer(block)] == []


def _shown_commands() -> list[tuple[str, str]]:
    """(page, command) for every `sparkfleet ...` line of a code block, its comment cut and [optional] parts kept."""
    shown = []
    for page in PAGES:
        for block in _code_blocks(page):
            for line in block.splitlines():
                line = line.split(" #", 1)[0].strip()
                if line.startswith("sparkfleet ") and not line.startswith("sparkfleet is"):
                    shown.append((page.name, re.sub(r"\[([^\]]*)\]", r"\1", line)))
    return shown


def test_every_sparkfleet_command_the_docs_show_is_one_the_command_line_takes():
    """A page cannot show a subcommand, an argument or a flag that `sparkfleet` does not have."""
    import contextlib
    import io
    import shlex

    from sparkfleet import cli
    from sparkfleet.refused import Refused

    shown = _shown_commands()
    assert len(shown) > 20 and {c.split()[1] for _, c in shown} >= {
        "init", "users", "plan", "status", "rollout", "rollback", "logs", "drain", "undrain", "hostkeys", "bench",
        "fetch", "update"}
    refused = []
    for page, command in shown:
        argv = [a for a in shlex.split(command)[1:] if a != "|"]
        with contextlib.redirect_stderr(io.StringIO()) as err:
            try:
                cli.parser().parse_args(argv)
            except Refused as exc:
                refused.append(f"{page}: {command}: {exc}")
            except SystemExit:
                refused.append(f"{page}: {command}: {err.getvalue().strip().splitlines()[-1:]}")
    assert refused == []


def test_every_module_path_architecture_names_exists():
    """ARCHITECTURE.md matches the code: each `dir/module.py` it names is a file of this checkout (the product's
    under sparkfleet/, the rest from the top), and each `module.py` `name` pair it gives names something there."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"`((?:[a-z_]+/)+[a-z_<>-]+\.(?:py|json|j2|lua|toml))`", text))
    missing = [path for path in sorted(named) if "<" not in path
               and not any((base / path).exists() for base in (ROOT, ROOT / "sparkfleet"))]
    assert missing == [], f"ARCHITECTURE.md names files that are not here: {missing}"
    pairs = re.findall(r"`((?:[a-z_]+/)+[a-z_]+\.py)` `([A-Za-z_][A-Za-z0-9_.]*)`", text)
    absent = []
    for path, name in pairs:
        source = next(base / path for base in (ROOT / "sparkfleet", ROOT) if (base / path).exists())
        if not re.search(rf"\b{re.escape(name.split('.')[0])}\b", source.read_text()):
            absent.append(f"{path} {name}")
    assert absent == [], f"ARCHITECTURE.md names what these files do not hold: {absent}"


# --- the import orders the docs state, against the real import graph (tests/unit/test_layers.py `graph`) --------

_ROOMS = re.compile(r"[Rr]ooms import downwards only: (\w+(?: <- \w+)+)")
_ROOM_PACKAGE = re.compile(r"`((?:sparkfleet|files)/(?:\w+/)*\w+)/`")


def _layers_stated(text: str) -> list[str]:
    """The rows of ARCHITECTURE.md's layers table, bottom first, each as the layer (test_layers' name) of the
    first `sparkfleet/...` path its `where` cell names; rows that name none (the defaults, the recipes) are out."""
    from tests.unit.test_layers import layer

    table = text[text.index("| layer (bottom first) |"):].split("\n\n", 1)[0].splitlines()[2:]
    stated = []
    for row in table:
        first = re.search(r"`(sparkfleet/[\w/.]*)`", row.split(" | ")[1])
        if first:
            module = first.group(1).removesuffix(".py").rstrip("/").replace("/", ".").removesuffix(".__init__")
            stated.append(layer(module))
    return stated


def _reaches(edges: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        for nxt in edges.get(node, ()):
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def _room_orders() -> list[tuple[str, Path, list[str]]]:
    """(where it is said, the package's directory, its rooms bottom first) of every "Rooms import downwards only:
    a <- b" sentence: in a package's docstring (under sparkfleet/ and files/), and in ARCHITECTURE.md after the
    package's `path/` on the same line."""
    import ast

    found = []
    for init in sorted([*(ROOT / "sparkfleet").rglob("__init__.py"), *(ROOT / "files").glob("*/__init__.py")]):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        found += [(str(init.relative_to(ROOT)), init.parent, m.group(1).split(" <- ")) for m in _ROOMS.finditer(doc)]
    for number, line in enumerate((ROOT / "ARCHITECTURE.md").read_text().splitlines(), 1):
        for m in _ROOMS.finditer(line):
            packages = _ROOM_PACKAGE.findall(line[:m.start()])
            assert packages, f"ARCHITECTURE.md:{number}: a room order that names no `package/` before it"
            found.append((f"ARCHITECTURE.md:{number}", ROOT / packages[-1], m.group(1).split(" <- ")))
    return found


def _room_order_problems(package: Path, rooms: list[str], root: Path = ROOT) -> list[str]:
    """What the code does not have of a stated room order: a room that is not a module of the package, a module
    the order leaves out, a room that imports one stated above it (directly or through any chain)."""
    from tests.unit.test_layers import graph

    product = root / "sparkfleet"
    edges = graph(product) if package.is_relative_to(product) else graph(package)
    base = ".".join(package.relative_to(root if package.is_relative_to(product) else package.parent).parts)
    modules = {p.stem for p in package.glob("*.py")} - {"__init__", "__main__"}
    problems = [f"{room} is no module of {base}" for room in rooms if room not in modules]
    problems += [f"{module} is left out" for module in sorted(modules - set(rooms))]
    problems += [f"{low} imports {high}, stated above it" for i, low in enumerate(rooms) for high in rooms[i + 1:]
                 if _reaches(edges, f"{base}.{low}", f"{base}.{high}")]
    return problems


def test_the_layers_table_states_the_order_the_imports_have():
    """ARCHITECTURE.md's layers table, bottom first, is test_layers' order, holds every layer the code has, and no
    module imports one of a layer the table puts above its own."""
    from tests.unit.test_layers import LAYERS, graph, layer

    stated = _layers_stated((ROOT / "ARCHITECTURE.md").read_text())
    assert stated == LAYERS, f"ARCHITECTURE.md's layers, bottom first: {stated}; the code's: {LAYERS}"
    rank = {name: i for i, name in enumerate(stated)}
    upward = sorted(f"{src} -> {dst}" for src, targets in graph().items() for dst in targets
                    if rank[layer(dst)] > rank[layer(src)])
    assert upward == []


def test_every_stated_room_order_is_the_one_the_imports_have():
    """A package docstring's (or ARCHITECTURE.md's) "Rooms import downwards only: a <- b <- c" names every room of
    the package, and no room imports one stated above it."""
    orders = _room_orders()
    assert {where for where, _, _ in orders} >= {"sparkfleet/roles/front_door/__init__.py",
                                                 "sparkfleet/fleet/front_door/__init__.py",
                                                 "files/sparkfleet_host/__init__.py"}
    problems = {where: _room_order_problems(package, rooms) for where, package, rooms in orders}
    assert {where: found for where, found in problems.items() if found} == {}


def test_the_room_order_check_fails_an_order_the_code_does_not_have(tmp_path):
    """The check itself: a room that imports one stated above it (here through a third), a room that is not
    there, a module left out."""
    package = tmp_path / "files" / "sparkfleet_rooms"
    package.mkdir(parents=True)
    for name, text in {"__init__.py": "", "low.py": "from sparkfleet_rooms import middle\n",
                       "middle.py": "from sparkfleet_rooms.high import x\n", "high.py": "x = 1\n",
                       "extra.py": ""}.items():
        (package / name).write_text(text)
    assert _room_order_problems(package, ["low", "middle", "high", "gone"], tmp_path) == [
        "gone is no module of sparkfleet_rooms", "extra is left out", "low imports middle, stated above it",
        "low imports high, stated above it", "middle imports high, stated above it"]
    assert _room_order_problems(package, ["high", "middle", "low", "extra"], tmp_path) == []
