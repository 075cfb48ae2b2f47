"""No deploy-time refusal that `plan` could have made: the deploy's refusals are the shared planner's, or marked
host-only with a reason.

Two rules, read from the source (so a refusal added later cannot slip past):
- every refusal site of the deploy path (a `raise` of a refusal in sparkfleet/tasks/, sparkfleet/deploys/, and the
  deploy's own functions of controller/inventory.py; a call to the stages' `refuse`) carries a marker, on its
  line, the line above, or above its function: `# refusal: planned` (what it catches, the shared planner refuses
  first: the role functions its `try` calls are all reached from it) or `# refusal: host-only: <why>` (only a host,
  a hub or a registry can say);
- every `raise` of a refusal in the planners the stages run (sparkfleet/roles/, sparkfleet/release/,
  sparkfleet/host/) sits in a function the shared planner reaches (`plan_hosts`, `plans_ca`,
  controller/checks.py `check_inventory`, which `plan` and the deploy's `plans` both run) or is marked host-only.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

import sparkfleet

PACKAGE = Path(sparkfleet.__file__).resolve().parent
DEPLOY_PATH = [*sorted((PACKAGE / "tasks").glob("*.py")), *sorted((PACKAGE / "deploys").glob("*.py"))]
DEPLOY_FUNCTIONS = {PACKAGE / "controller" / "inventory.py": {"plans", "chat_ui_of", "plan_for"}}
PLANNERS = [p for d in ("roles", "release", "host") for p in sorted((PACKAGE / d).rglob("*.py"))]
GRAPH_FILES = [*PLANNERS, *sorted((PACKAGE / "contract").glob("*.py")), *sorted((PACKAGE / "controller").glob("*.py")),
               PACKAGE / "commands" / "plan.py", *DEPLOY_PATH]
REFUSALS = {"SettingsError", "DeployRefused", "Refused", "InventoryError", "RecipeError", "LockError"}
MARKER = re.compile(r"#\s*refusal:\s*(planned\b|host-only:\s*(\S.{9,}))")


def raised_name(node: ast.Raise) -> str | None:
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return exc.id if isinstance(exc, ast.Name) else exc.attr if isinstance(exc, ast.Attribute) else None


def functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def enclosing(tree: ast.AST, node: ast.AST):
    """The innermost function holding `node`."""
    found = None
    for f in functions(tree):
        if f.lineno <= node.lineno <= f.end_lineno and (found is None or f.lineno >= found.lineno):
            found = f
    return found


def comments_above(lines: list[str], lineno: int) -> list[int]:
    """The line numbers of the comment block right above line `lineno`."""
    found, n = [], lineno - 1
    while n >= 1 and lines[n - 1].lstrip().startswith("#"):
        found.append(n)
        n -= 1
    return found


def marker(lines: list[str], node: ast.AST, func) -> re.Match | None:
    """The marker on the node's first line, in the comments right above it, or in those above its function (or
    its decorators)."""
    candidates = [node.lineno, node.lineno - 1, *comments_above(lines, node.lineno)]
    if func is not None:
        candidates += comments_above(lines, min([func.lineno, *(d.lineno for d in func.decorator_list)]))
    for n in candidates:
        if 1 <= n <= len(lines) and (found := MARKER.search(lines[n - 1])):
            return found
    return None


def refusal_sites(path: Path, only: set[str] | None = None):
    """(line, the raise or refuse call, its function) of every refusal in `path` (in `only`'s functions)."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        is_raise = isinstance(node, ast.Raise) and node.exc is not None and raised_name(node) in REFUSALS
        is_refuse = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "refuse"
        if is_raise or is_refuse:
            func = enclosing(tree, node)
            if only is None or (func is not None and func.name in only):
                yield tree, node, func


def called(node: ast.AST) -> set[str]:
    """The names a piece of code calls (f(...) and x.f(...) alike)."""
    return {c.func.id if isinstance(c.func, ast.Name) else c.func.attr for c in ast.walk(node)
            if isinstance(c, ast.Call) and isinstance(c.func, (ast.Name, ast.Attribute))}


@functools.lru_cache(maxsize=1)
def graph() -> dict[str, set[str]]:
    """{function name: the names it calls} over the planners, the contract, the controller, `plan` and the deploy
    path (a name shared by two functions merges them: the rules err towards reached)."""
    found: dict[str, set[str]] = {}
    for path in GRAPH_FILES:
        for f in functions(ast.parse(path.read_text())):
            found.setdefault(f.name, set()).update(called(f))
    return found


def defined(paths) -> set[str]:
    return {f.name for path in paths for f in functions(ast.parse(path.read_text()))}


def reached(roots=None) -> set[str]:
    """Every function name reached from `roots` (default: what `sparkfleet plan` runs, commands/plan.py)."""
    edges = graph()
    seen, todo = set(), list(roots if roots is not None else defined([PACKAGE / "commands" / "plan.py"]))
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += edges.get(name, ())
    return seen


def raisers() -> set[str]:
    """The functions holding a refusal's raise, in the planners, the controller and the deploy path."""
    return {func.name for path in GRAPH_FILES for _, node, func in refusal_sites(path)
            if isinstance(node, ast.Raise) and func is not None}


def deployed() -> set[str]:
    """Every function name the deploy reaches: from the stages, the deploy files and the deploy's own functions."""
    return reached(defined(DEPLOY_PATH) | {n for names in DEPLOY_FUNCTIONS.values() for n in names})


def test_every_refusal_of_the_deploy_path_is_planned_or_host_only():
    """A stage's refusal without a marker is one `plan` might not make: say which it is."""
    unmarked, sites = [], 0
    for path in [*DEPLOY_PATH, *DEPLOY_FUNCTIONS]:
        lines = path.read_text().splitlines()
        for _, node, func in refusal_sites(path, DEPLOY_FUNCTIONS.get(path)):
            sites += 1
            if not marker(lines, node, func):
                unmarked.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert sites >= 8, "the scan found too few refusal sites: is it still reading the deploy path?"
    assert not unmarked, ("refusals the deploy makes that `plan` may not: move each into the shared planner "
                          "(controller/checks.py check_inventory) and mark it `# refusal: planned`, or mark it "
                          f"`# refusal: host-only: <why>`: {unmarked}")


def test_a_planned_refusal_catches_only_what_the_planner_runs():
    """`# refusal: planned` on an `except` of a stage: every planner its `try` calls is one the shared planner
    reaches, so the refusal can only repeat one `plan` made."""
    planned, refusing = reached(), raisers()
    callers: dict[str, set[str]] = {}
    for name, calls in graph().items():
        for callee in calls:
            callers.setdefault(callee, set()).add(name)
    may_refuse, todo = set(), list(refusing)
    while todo:  # every function from which a refusal's raise is reached
        name = todo.pop()
        if name not in may_refuse:
            may_refuse.add(name)
            todo += callers.get(name, ())
    wrong = []
    for path in [*DEPLOY_PATH, *DEPLOY_FUNCTIONS]:
        lines = path.read_text().splitlines()
        for tree, node, func in refusal_sites(path, DEPLOY_FUNCTIONS.get(path)):
            found = marker(lines, node, func)
            if not found or not found.group(1).startswith("planned"):
                continue
            trys = [t for t in ast.walk(tree) if isinstance(t, ast.Try)
                    and any(h.lineno <= node.lineno <= h.end_lineno for h in t.handlers)]
            assert trys, f"{path.name}:{node.lineno}: `planned` marks an except of a try"
            body = ast.Module(body=trys[-1].body, type_ignores=[])
            missed = sorted((called(body) & may_refuse) - planned)
            if missed:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {missed}")
    assert not wrong, f"`# refusal: planned`, but the shared planner never runs: {wrong}"


def test_every_refusal_the_deploy_reaches_is_one_plan_reaches_or_host_only():
    """A refusal of a role, the release, a host module or the controller that the deploy reaches and `plan` does
    not would come only at the deploy: each is reached by `plan` too (plan_hosts, plans_ca, check_inventory), or
    says why only a host (a hub, a registry) can answer."""
    planned, deploy, stray, sites = reached(), deployed(), [], 0
    for path in [*PLANNERS, *sorted((PACKAGE / "controller").glob("*.py"))]:
        lines = path.read_text().splitlines()
        for _, node, func in refusal_sites(path):
            if isinstance(node, ast.Call):
                continue  # host/preflight.py's `refuse` is a host's facts, its own report, not a raise
            if func is not None and func.name in DEPLOY_FUNCTIONS.get(path, ()):
                continue  # a deploy function's site: the first two tests hold it
            sites += 1
            found = marker(lines, node, func)
            if found and found.group(1).startswith("host-only"):
                continue
            if func is not None and func.name in deploy and func.name not in planned:
                stray.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} ({func.name if func else 'module'})")
    assert sites >= 10
    assert not stray, ("refusals `plan` never reaches: call their planner from controller/checks.py "
                       f"check_inventory, or mark them `# refusal: host-only: <why>`: {stray}")


def test_the_deploy_and_plan_run_the_same_checks():
    """One owner: the deploy's inventory plans (controller/inventory.py `plans`) and the `plan` command both call
    check_inventory."""
    inventory = ast.parse((PACKAGE / "controller" / "inventory.py").read_text())
    plans = next(f for f in functions(inventory) if f.name == "plans")
    assert {"plan_hosts", "plans_ca", "check_inventory"} <= called(plans)
    command = (PACKAGE / "commands" / "plan.py").read_text()
    assert "check_inventory(" in command and "plans_ca(" in command


def test_the_scan_catches_an_unmarked_refusal(tmp_path):
    """The rule could fail: a stage raising DeployRefused without a marker is found, with one it is not."""
    bare = tmp_path / "stage.py"
    bare.write_text("def stage():\n    try:\n        f()\n    except SettingsError as exc:\n"
                    "        raise DeployRefused(str(exc))\n")
    (node,) = [n for _, n, _ in refusal_sites(bare)]
    assert marker(bare.read_text().splitlines(), node, None) is None
    marked = tmp_path / "marked.py"
    marked.write_text(bare.read_text().replace("str(exc))", "str(exc))  # refusal: host-only: the host's own disk"))
    (node,) = [n for _, n, _ in refusal_sites(marked)]
    assert marker(marked.read_text().splitlines(), node, None)
    short = tmp_path / "short.py"
    short.write_text(bare.read_text().replace("str(exc))", "str(exc))  # refusal: host-only: x"))
    (node,) = [n for _, n, _ in refusal_sites(short)]
    assert marker(short.read_text().splitlines(), node, None) is None, "a reason of a few characters is none"


def test_the_deploy_reaches_the_role_refusals_and_plan_reaches_them_too():
    """The graph is not empty-handed: the deploy reaches the roles' planners that refuse, and so does `plan`."""
    deploy, planned = deployed(), reached()
    for name in ("chat_ui_plan", "front_door_plan", "monitoring_plan", "guard_plan", "ca_of", "door_set"):
        assert name in deploy and name in planned, name
    assert "interface_for" in deploy and "interface_for" not in planned


def test_the_deploy_refuses_what_plan_refuses_with_the_same_line(tmp_path, monkeypatch):
    """The deploy's one planning of the inventory (controller/inventory.py `plans`, as pyinfra runs it) refuses a
    port clash and a group typo with the lines `plan` prints, before any stage: one owner, two callers."""
    from pyinfra.api import Config, Inventory, State

    from sparkfleet.contract.settings import SettingsError
    from sparkfleet.controller import checks
    from sparkfleet.controller import inventory as inventory_mod
    from sparkfleet.release.plan import plan_hosts

    from .helpers import host_data

    monkeypatch.setenv("SPARKFLEET_LOCK", str(tmp_path / "sparkfleet.lock"))
    monkeypatch.setattr(inventory_mod, "hub_resolver", lambda s: (None, None, "offline test: no hub is asked"))
    monkeypatch.setattr(inventory_mod, "image_resolver", lambda s: (None, "offline test: no registry is asked"))
    data = {"api_host": "0.0.0.0", "api_key": "engines-key-0123456789", "backend_key_in_clear": True}
    fleet = Inventory(([("spark-1", host_data(ssh_hostname="10.0.0.1", peer_port=8000, **data)),
                        ("spark-2", host_data(ssh_hostname="10.0.0.2", **data))], {}),
                      sparks=(["spark-1", "spark-2"], {}), chatui=(["spark-2"], {}))
    with pytest.raises(SettingsError) as deploy:
        inventory_mod.plans(State(fleet, Config()))
    hosts = [(h.name, inventory_mod.host_data(h)) for h in fleet]
    with pytest.raises(SettingsError) as planned:
        checks.check_inventory(hosts, plan_hosts(hosts))
    assert deploy.value.problems == planned.value.problems
    assert any("spark-1: setting `peer_port` = 8000 is `api_port` too" in line for line in deploy.value.problems)
    assert any("group `chatui` (spark-2)" in line and "`chat_ui`" in line for line in deploy.value.problems)
