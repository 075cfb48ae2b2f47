"""Every inventory or settings snippet of README.md and docs/ plans as written: each is put into the project
`sparkfleet init` makes (the README's first steps: init, `users add alice`) and planned with `sparkfleet plan
--offline`, which must exit 0. A snippet that shows a refusal on purpose says so in an HTML comment right before
its block (`<!-- refused: ... -->`) and must exit 2. Client and deploy code (no setting, no group) is not planned.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from sparkfleet import cli
from sparkfleet.contract.monitoring import FRONT_DOOR_GROUP, GROUP as MONITORING_GROUP
from sparkfleet.contract.paths import CHAT_UI_GROUP

from sparkfleet.contract.settings import parse_settings

from .helpers import DEFAULTS, ROOT, host_data

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REFUSED = re.compile(r"<!--\s*refused:")
NO_KEYSCAN = "#!/bin/sh\nexit 1\n"  # every Spark "did not answer": init asks no network
GROUP_NAMES = {"sparks", FRONT_DOOR_GROUP, MONITORING_GROUP, CHAT_UI_GROUP}
SETTING_KEY = re.compile(r"""["']([a-z_][a-z0-9_]*)["']\s*:""")


def snippets() -> list[tuple[str, str, bool]]:
    """(page:line, the python block, refused on purpose) of every python block that sets a setting or a group."""
    found = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for token in MarkdownIt("commonmark").parse(page.read_text()):
            if token.type != "fence" or token.info.strip() != "python" or not token.map:
                continue
            start = token.map[0]
            before = next((line for line in reversed(lines[:start]) if line.strip()), "")
            if _is_inventory(token.content):
                found.append((f"{page.relative_to(ROOT)}:{start + 1}", token.content, bool(REFUSED.search(before))))
    return found


def _is_inventory(code: str) -> bool:
    """A block that names a setting (a dict key of group_data/all.py's) or assigns one of sparkfleet's groups."""
    keys = set(SETTING_KEY.findall(code)) & (set(DEFAULTS) | {"ssh_hostname", "ssh_user"})
    groups = re.findall(r"^([a-z_]+)\s*=", code, re.M)
    return bool(keys) or any(g in GROUP_NAMES for g in groups)


def _evaluated(code: str, namespace: dict) -> tuple[dict[str, dict], dict[str, list]]:
    """The snippet run in the project's inventory namespace: ({host: its data}, {group: its host names}); a
    fragment of one host's data ("key": value, lines) is spark-1's, as the pages say; `...` stands for the rest."""
    code = re.sub(r"\{\s*\.\.\.\s*,?", "{", code)
    try:
        body = ast.parse(code)
    except SyntaxError:
        body = None
    if body is None or not any(isinstance(n, (ast.Assign, ast.Import, ast.ImportFrom)) for n in body.body):
        first = next(line for line in code.splitlines() if line.strip() and not line.lstrip().startswith("#"))
        value = eval(compile(f"[{code}\n]" if first.lstrip().startswith("(") else f"{{{code}\n}}", "<doc>", "eval"),
                     dict(namespace))
        if isinstance(value, dict):
            return {"spark-1": value}, {}
        return dict(value), {}
    scope = dict(namespace)
    exec(compile(code, "<doc>", "exec"), scope)
    hosts: dict[str, dict] = {}
    groups: dict[str, list] = {}
    for name, value in scope.items():
        if name.startswith("_") or name in namespace or not isinstance(value, list):
            continue
        groups[name] = [h if isinstance(h, str) else h[0] for h in value]
        hosts.update({h[0]: h[1] for h in value if isinstance(h, tuple)})
    return hosts, groups


def _inventory_with(base: str, hosts: dict[str, dict], groups: dict[str, list]) -> str:
    """The project's inventory.py, then the snippet: a host of the project takes the snippet's data over its own,
    a new host is defined in the first group that lists it."""
    tail = ["", "# the docs' snippet", f"_doc_hosts = {hosts!r}", "_known = dict(sparks)",
            "for _name, _data in _doc_hosts.items():",
            "    if _name in _known:", "        _known[_name].update(_data)"]
    defined = set()
    for group, names in groups.items():
        if group == "sparks":
            tail.append(f"sparks = [h for h in sparks if h[0] in {names!r}] + [(n, _doc_hosts[n]) for n in "
                        f"{[n for n in names if n not in ('spark-1', 'spark-2', 'spark-3')]!r}]")
            defined.update(names)
            continue
        entries = [f"({n!r}, _doc_hosts[{n!r}])" if n in hosts and n not in defined and
                   n not in ("spark-1", "spark-2", "spark-3") else repr(n) for n in names]
        defined.update(names)
        tail.append(f"{group} = [{', '.join(entries)}]")
    return base + "\n".join(tail) + "\n"


@pytest.fixture(scope="module")
def office(tmp_path_factory):
    """`sparkfleet init office` for three Sparks and `users add alice`, as the README's first steps; a viewer in
    the secrets file for the status page's snippet."""
    if not shutil.which("openssl"):  # without it init writes no front door certificate, and plan asks for one
        pytest.skip("sparkfleet init makes the front door's certificate with openssl")
    root = tmp_path_factory.mktemp("docs")
    with pytest.MonkeyPatch.context() as mp:
        (root / "bin").mkdir()
        (root / "bin" / "ssh-keyscan").write_text(NO_KEYSCAN)
        (root / "bin" / "ssh-keyscan").chmod(0o755)
        mp.setenv("PATH", f"{root / 'bin'}:{__import__('os').environ['PATH']}")
        mp.setenv("HOME", str(root / "home"))
        assert cli.main(["init", str(root / "office"), "--host", "spark-1=10.0.0.11", "--host", "spark-2=10.0.0.12",
                         "--host", "spark-3=10.0.0.13"]) == 0
        assert cli.main(["users", "add", str(root / "office" / "inventory.py"), "alice"]) == 0
    secrets = root / "home" / ".config" / "sparkfleet" / "office.json"
    doc = json.loads(secrets.read_text())
    secrets.write_text(json.dumps({**doc, "viewers": {"carol": "carol-password-0123456789"}}))
    return root


def _plan(office: Path, tmp_path: Path, monkeypatch, code: str) -> int:
    project = tmp_path / "office"
    shutil.copytree(office / "office", project)
    monkeypatch.setenv("HOME", str(office / "home"))
    monkeypatch.setenv("SPARKFLEET_LOCK", str(tmp_path / "sparkfleet.lock"))
    monkeypatch.setenv("SPARKFLEET_CACHE", str(tmp_path / "cache"))
    base = (project / "inventory.py").read_text()
    namespace: dict = {}
    exec(compile(base, str(project / "inventory.py"), "exec"), {"__file__": str(project / "inventory.py")}, namespace)
    hosts, groups = _evaluated(code, {**{k: v for k, v in namespace.items() if k.startswith("_")},
                                      "__file__": str(project / "inventory.py")})
    (project / "inventory.py").write_text(_inventory_with(base, hosts, groups))
    return cli.main(["plan", str(project / "inventory.py"), "--offline"])


@pytest.mark.parametrize("where, code, refused", snippets(), ids=[s[0] for s in snippets()])
def test_every_inventory_snippet_of_the_docs_plans_as_written(where, code, refused, office, tmp_path, monkeypatch,
                                                              capsys):
    code_ = _plan(office, tmp_path, monkeypatch, code)
    err = capsys.readouterr().err
    assert code_ == (2 if refused else 0), f"{where}: {err}"


def test_the_two_examples_of_the_issue_are_among_them():
    """The README's second model and several-models.md's opening example (both once refused for the coder's
    context) are found, so they are planned."""
    found = [where for where, _, _ in snippets()]
    assert any(w.startswith("README.md:") for w in found) and any(w.startswith("docs/several-models.md:")
                                                                 for w in found)
    assert len(found) >= 12


def test_a_snippet_that_does_not_fit_is_refused(office, tmp_path, monkeypatch, capsys):
    """The harness can fail: the README's second model as it was (the coder's default context) exits 2."""
    code = '"services": {"coder": {"recipe": "qwen3-coder-30b-a3b-fp8", "api_port": 8003, ' \
           '"kv_cache_memory_bytes": 8_000_000_000}}'
    assert _plan(office, tmp_path, monkeypatch, code) == 2
    assert "set max_model_len <= 80896" in capsys.readouterr().err


def inline_settings() -> list[tuple[str, str, object]]:
    """(page, setting, value) of every `setting = value` the pages' prose shows, where the value is a literal."""
    found = []
    for page in PAGES:
        if page.name == "settings-reference.md":  # generated from group_data/all.py, checked by test_docs.py
            continue
        for name, text in re.findall(r"`([a-z_][a-z0-9_]*) = ([^`]+)`", page.read_text()):
            try:
                value = ast.literal_eval(text.replace("true", "True").replace("false", "False"))
            except (ValueError, SyntaxError):
                continue  # an expression, not a value
            if name in DEFAULTS and value != "...":  # `engine = "..."`: a placeholder
                found.append((str(page.relative_to(ROOT)), name, value))
    return found


@pytest.mark.parametrize("where, name, value", inline_settings(), ids=[f"{w}:{n}" for w, n, _ in inline_settings()])
def test_every_setting_the_prose_shows_is_one_the_settings_take(where, name, value):
    """A setting written in a sentence (`watchdog = False`) is typed as written: its name and its value."""
    parse_settings("spark-1", host_data(**{name: value}))


def test_the_prose_settings_are_found():
    assert {("docs/settings.md", "watchdog", False), ("README.md", "front_door_allow_http", True)} & {
        (w, n, v) for w, n, v in inline_settings()}
