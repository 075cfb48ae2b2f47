"""Installed is the product: the stages and the deploy files live inside `sparkfleet`, import with nothing else
on the path, and the fleet commands run the project's own deploy file when it has one, the packaged one otherwise."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import sparkfleet
from sparkfleet.fleet.converge import deploy_path
from tests.unit.helpers import ROOT

DEPLOY_FILES = ["sparkfleet/deploys/deploy.py", "sparkfleet/deploys/rollback.py", "sparkfleet/deploys/stage.py",
                "deploy.py", "rollback.py", "examples/my_deploy.py"]
# Run with only `sparkfleet` on the path: every stage module imported, and every name a deploy file imports found
# (a deploy file is executed per host, not imported: importing it would run its stages).
CHECK = """
import ast, importlib, importlib.util, json, pathlib, sys
stages = sorted(p.stem for p in pathlib.Path(sys.argv[1]).glob("*.py") if p.stem != "__init__")
for name in ["sparkfleet.tasks", "sparkfleet.deploys"] + [f"sparkfleet.tasks.{s}" for s in stages]:
    importlib.import_module(name)
missing = []
for path in sys.argv[2:]:
    for node in ast.walk(ast.parse(pathlib.Path(path).read_text())):
        if isinstance(node, ast.ImportFrom):
            module = importlib.import_module(node.module)
            missing += [f"{path}: {node.module}.{a.name}" for a in node.names if not hasattr(module, a.name)]
        elif isinstance(node, ast.Import):
            [importlib.import_module(a.name) for a in node.names]
print(json.dumps({"stages": stages, "missing": missing, "top_level_tasks": bool(importlib.util.find_spec("tasks"))}))
"""


def only_sparkfleet(tmp_path: Path) -> dict:
    """PYTHONPATH holding nothing but this checkout's `sparkfleet`, from a directory that is not the checkout."""
    path = tmp_path / "path"
    path.mkdir()
    (path / "sparkfleet").symlink_to(ROOT / "sparkfleet")
    env = {**os.environ, "PYTHONPATH": str(path)}
    env.pop("VIRTUAL_ENV", None)
    return {"cwd": tmp_path, "env": env, "capture_output": True, "text": True, "timeout": 120}


def test_the_stages_and_deploy_files_import_with_only_sparkfleet_on_the_path(tmp_path):
    proc = subprocess.run([sys.executable, "-c", CHECK, str(ROOT / "sparkfleet/tasks"),
                           *(str(ROOT / f) for f in DEPLOY_FILES)], **only_sparkfleet(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.splitlines()[-1])
    assert {"preflight", "model", "service", "health", "rollback", "front_door"} <= set(found["stages"])
    assert found["missing"] == []
    assert not found["top_level_tasks"]  # the stages are `sparkfleet.tasks` alone: a `tasks.` import fails


def test_the_project_is_the_checkout_here_and_the_current_directory_installed(tmp_path):
    assert sparkfleet.PROJECT_ROOT == ROOT
    site, project = tmp_path / "site", tmp_path / "project"
    shutil.copytree(ROOT / "sparkfleet", site / "sparkfleet", ignore=shutil.ignore_patterns("__pycache__"))
    project.mkdir()
    proc = subprocess.run([sys.executable, "-c", "import sparkfleet; print(sparkfleet.PROJECT_ROOT)"], cwd=project,
                          env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()) == project.resolve()


def test_a_project_s_own_deploy_file_is_run_else_the_packaged_one(tmp_path):
    packaged = Path(sparkfleet.__file__).resolve().parent / "deploys"
    assert deploy_path("deploy.py", tmp_path) == packaged / "deploy.py"
    assert deploy_path("rollback.py", tmp_path) == packaged / "rollback.py"
    assert all(deploy_path(name, tmp_path).is_file() for name in ("deploy.py", "rollback.py", "stage.py"))
    (tmp_path / "rollback.py").write_text("")
    (tmp_path / "deploy.py").mkdir()  # not a file: not a deploy
    assert deploy_path("rollback.py", tmp_path) == tmp_path / "rollback.py"
    assert deploy_path("deploy.py", tmp_path) == packaged / "deploy.py"


def test_from_the_checkout_its_own_deploy_files_are_run():
    assert deploy_path("deploy.py") == ROOT / "deploy.py"
    assert deploy_path("rollback.py") == ROOT / "rollback.py"


def test_run_deploy_loads_the_chosen_file_and_a_refusal_fails_every_host(monkeypatch):
    """A deploy that refuses while pyinfra loads it (bad front door settings, say) changed nothing and is no success."""
    from contextlib import contextmanager

    from pyinfra.api import Config, Inventory, State

    from sparkfleet.fleet import converge
    from sparkfleet.controller.inventory import DeployRefused

    inventory = Inventory(([("spark-1", {}), ("spark-2", {})], {}))
    state, loaded = State(inventory, Config()), []

    @contextmanager
    def connected(inventory_path, names, data=None):
        yield state, [inventory.get_host(name) for name in names]

    def load(state, filename):
        loaded.append(filename)
        raise DeployRefused("invalid front door settings; no host was changed")

    monkeypatch.setattr(converge, "connected", connected)
    monkeypatch.setattr(converge, "load_deploy_file", load)
    results = converge.run_deploy("inventory.py", ["spark-1", "spark-2"], deploy_file="rollback.py",
                                  before_ops=lambda: loaded.append("drained"))
    assert loaded == [str(ROOT / "rollback.py")]  # the checkout's own, as deploy_path chose; nothing drained
    assert {name: (r.ok, r.failed) for name, r in results.items()} == {
        name: (False, ["invalid front door settings; no host was changed"]) for name in ("spark-1", "spark-2")}


def test_run_deploy_calls_before_ops_once_the_deploy_is_planned_and_before_any_operation_runs(monkeypatch):
    """A rollout's drain: after pyinfra connected and loaded the deploy (its facts read), before run_ops."""
    from contextlib import contextmanager

    from pyinfra.api import Config, Inventory, State

    from sparkfleet.fleet import converge

    inventory = Inventory(([("spark-1", {})], {}))
    state, order = State(inventory, Config()), []

    @contextmanager
    def connected(inventory_path, names, data=None):
        yield state, [inventory.get_host(name) for name in names]

    monkeypatch.setattr(converge, "connected", connected)
    monkeypatch.setattr(converge, "load_deploy_file", lambda state, filename: order.append("loaded"))
    monkeypatch.setattr(converge, "run_ops", lambda state: order.append("operations"))
    converge.run_deploy("inventory.py", ["spark-1"], before_ops=lambda: order.append("drained"))
    assert order == ["loaded", "drained", "operations"]
