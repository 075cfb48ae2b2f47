"""A project is its folder (issue 51, item 3): group_data/, the lock, .cache/ and deploy.py are the inventory's
project's (controller/inventory.py `project_of`), wherever a command runs from; a stray group_data/ beside the
command is never read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import sparkfleet
from sparkfleet import cli
from sparkfleet.contract.settings import USER_SET_KEY
from sparkfleet.controller.inventory import load_hosts, lock_path, project_for, project_of
from sparkfleet.fleet.converge import deploy_path
from sparkfleet.model.hubs import cache_dir

from tests.unit.test_lock import Hub
from tests.unit.helpers import no_keyscan

ROOT = Path(__file__).resolve().parents[2]
STRAY = "max_model_len = 4096  # a parent folder's group_data: not this office's\n"


@pytest.fixture
def office(tmp_path, monkeypatch, capsys):
    """`sparkfleet init office` run in tmp/ (no Spark answers its key scan), a stray tmp/group_data/all.py beside
    it, and sparkfleet as installed: its project otherwise the current directory, tmp/ (sparkfleet/__init__.py)."""
    if not shutil.which("ssh-keygen"):
        pytest.skip("init's host key check needs OpenSSH's ssh-keygen")
    no_keyscan(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sparkfleet, "PROJECT_ROOT", tmp_path)  # installed: the current directory
    assert cli.main(["init", "office", "--host", "spark-1=10.0.0.11", "--host", "spark-2=10.0.0.12"]) == 0
    out = capsys.readouterr().out
    assert "next: sparkfleet users add office/inventory.py NAME; sparkfleet plan office/inventory.py" in out
    assert "hand colleagues that file" in out  # the door's certificate: how their clients trust it (README)
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text(STRAY)
    return tmp_path / "office"


def plan_json(inventory: str, capsys) -> dict:
    assert cli.main(["plan", inventory, "--offline", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_from_the_parent_folder_is_the_plan_from_the_project(office, monkeypatch, capsys):
    """The issue's case: from tmp/, `plan office/inventory.py` applied tmp/group_data's max_model_len."""
    from_parent = plan_json("office/inventory.py", capsys)
    monkeypatch.chdir(office)
    assert plan_json("inventory.py", capsys) == from_parent
    args = from_parent["hosts"][0]["engine_args"]
    assert args[args.index("--max-model-len") + 1] != "4096"  # the stray file was not read
    assert all(data.get("max_model_len") != 4096 for _, data in load_hosts(str(office / "inventory.py")))


def test_the_project_s_own_group_data_applies_from_anywhere(office, monkeypatch, tmp_path, capsys):
    """Not just the stray file left out: the office's group_data/ is read from tmp/ and from an unrelated folder."""
    (office / "group_data" / "all.py").write_text("max_model_len = 32768\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for cwd, inventory in ((tmp_path, "office/inventory.py"), (elsewhere, str(office / "inventory.py"))):
        monkeypatch.chdir(cwd)
        args = plan_json(inventory, capsys)["hosts"][0]["engine_args"]
        assert args[args.index("--max-model-len") + 1] == "32768", cwd


def test_the_lock_and_the_cache_are_the_project_s(office, monkeypatch, tmp_path, capsys):
    """With no SPARKFLEET_LOCK / SPARKFLEET_CACHE, a plan run from tmp/ writes office/sparkfleet.lock, not
    tmp/sparkfleet.lock; .cache/ is office/.cache; after the command the process's project is what it was."""
    monkeypatch.delenv("SPARKFLEET_LOCK")
    monkeypatch.delenv("SPARKFLEET_CACHE")
    hub = Hub()
    monkeypatch.setattr("sparkfleet.controller.inventory.hub_resolver", hub.resolve)
    monkeypatch.setattr("sparkfleet.controller.inventory.image_resolver", hub.resolve_image)
    assert cli.main(["plan", "office/inventory.py", "--json"]) == 0
    capsys.readouterr()
    assert hub.asked  # the plan resolved (and so locked) the model
    assert "Qwen/Qwen3.5-35B-A3B-FP8" in (office / "sparkfleet.lock").read_text()
    assert not (tmp_path / "sparkfleet.lock").exists()
    assert sparkfleet.PROJECT_ROOT == tmp_path  # put back once the command is done
    with project_for("office/inventory.py") as project:
        assert project == office.resolve()
        assert lock_path() == office.resolve() / "sparkfleet.lock"
        assert cache_dir() == office.resolve() / ".cache"
        assert deploy_path("deploy.py") == office.resolve() / "deploy.py"  # init's deploy.py
    assert lock_path() == tmp_path / "sparkfleet.lock"  # outside a command: the process's project


def test_the_environment_still_names_the_lock_and_the_cache(office, monkeypatch, tmp_path):
    monkeypatch.setenv("SPARKFLEET_LOCK", str(tmp_path / "elsewhere.lock"))
    monkeypatch.setenv("SPARKFLEET_CACHE", str(tmp_path / "cache-elsewhere"))
    with project_for("office/inventory.py"):
        assert lock_path() == tmp_path / "elsewhere.lock"
        assert cache_dir() == tmp_path / "cache-elsewhere"


def test_the_project_is_the_nearest_folder_with_group_data_or_deploy_py(tmp_path):
    """inventories/prod.py under a project is the project's; a folder with neither is its own; the nearest wins."""
    (tmp_path / "p" / "inventories" / "deep").mkdir(parents=True)
    assert project_of(tmp_path / "p" / "inventories" / "deep" / "x.py") == (tmp_path / "p" / "inventories" / "deep")
    (tmp_path / "p" / "deploy.py").write_text("")
    assert project_of(tmp_path / "p" / "inventories" / "deep" / "x.py") == tmp_path / "p"
    (tmp_path / "p" / "inventories" / "group_data").mkdir()
    assert project_of(tmp_path / "p" / "inventories" / "deep" / "x.py") == tmp_path / "p" / "inventories"
    assert project_of(tmp_path / "p" / "inventories" / "prod.py") == tmp_path / "p" / "inventories"
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "group_data").write_text("")  # a file, not a folder: no group_data
    assert project_of(tmp_path / "q" / "inventory.py") == tmp_path / "q"


def test_the_checkout_s_inventories_keep_the_checkout_as_their_project(tmp_path, monkeypatch):
    """inventory/*.py (the simulated fleets', the hand-written examples) sit in inventory/, without group_data/ or
    deploy.py: their project is the checkout, whose group_data/ and deploy.py they had when run from its root,
    and still have from elsewhere (a stray group_data/ there ignored)."""
    inventories = sorted((ROOT / "inventory").glob("*.py"))
    assert any(p.name.startswith("sim") for p in inventories)
    assert {project_of(p) for p in inventories} == {ROOT}
    assert (ROOT / "group_data" / "all.py").is_file()
    monkeypatch.chdir(ROOT)
    from_root = load_hosts("inventory/office.py")
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text(STRAY)
    (tmp_path / "group_data" / "sparks.py").write_text(STRAY)
    monkeypatch.chdir(tmp_path)
    assert load_hosts(str(ROOT / "inventory" / "office.py")) == from_root
    assert "max_model_len" not in dict(from_root)["spark-a"][USER_SET_KEY]
    with project_for(ROOT / "inventory" / "sim.py"):
        assert deploy_path("deploy.py") == ROOT / "deploy.py"


def test_a_deploy_run_from_elsewhere_is_the_project_s(office, monkeypatch):
    """`sparkfleet rollout office/inventory.py` run from tmp/: the inventory pyinfra connects is read in the project
    (its group_data/, the stray one not), pyinfra's cwd (the deploy's relative paths) is the project, and the
    deploy loaded is office/deploy.py."""
    from sparkfleet.fleet import converge

    (office / "group_data" / "sparks.py").write_text("max_model_len = 32768\n")
    loaded = []

    def load(state, filename):
        data = {h.name: h.data.get("max_model_len") for h in state.inventory}
        loaded.append((state.cwd, filename, data))

    monkeypatch.setattr(converge, "connect_all", lambda state: None)
    monkeypatch.setattr(converge, "disconnect_all", lambda state: None)
    monkeypatch.setattr(converge, "load_deploy_file", load)
    monkeypatch.setattr(converge, "run_ops", lambda state: None)
    converge.run_deploy("office/inventory.py", ["spark-1"])
    project = office.resolve()
    assert loaded == [(str(project), str(project / "deploy.py"), {"spark-1": 32768, "spark-2": 32768})]


def test_sparkfleet_s_defaults_are_beneath_the_project_s_group_data(office):
    """The package's group_data/all.py is read first (a checkout's and an installed copy's host data alike), the
    project's all.py over it, and neither counts as set by the user."""
    from sparkfleet.contract.settings import defaults

    (office / "group_data" / "all.py").write_text("gpu_memory_utilization = 0.8\n")
    data = dict(load_hosts("office/inventory.py"))["spark-1"]
    assert data["gpu_memory_utilization"] == 0.8
    assert data["served_model_name"] == defaults()["served_model_name"]
    assert "served_model_name" not in data[USER_SET_KEY] and "gpu_memory_utilization" not in data[USER_SET_KEY]
    assert data["max_model_len"] == defaults()["max_model_len"]  # the stray 4096 not read
