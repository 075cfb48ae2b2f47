"""`sparkfleet init --ssh-user NAME`: a user other than root gets pyinfra's `_sudo` in the inventory init writes, and
what reads a host through that inventory escalates with it (pyinfra's own commands, `sparkfleet logs`)."""

from __future__ import annotations

import pytest
from pyinfra.api import Config, State
from pyinfra.api.arguments import pop_global_arguments
from pyinfra.context import ctx_config, ctx_inventory, ctx_state
from pyinfra_cli.inventory import make_inventory

from sparkfleet import cli
from sparkfleet.controller.inventory import load_hosts
from sparkfleet.fleet.logs import logs_argv
from sparkfleet.fleet.project import render_inventory
from tests.unit.test_project import keys  # noqa: F401  (the stand-in ssh-keyscan fixture)


def _init(tmp_path, *extra: str):
    office = tmp_path / "office"
    assert cli.main(["init", str(office), "--host", "spark-a=10.0.0.1", "--host", "spark-b=10.0.0.2", *extra]) == 0
    return office / "inventory.py"


def test_a_user_other_than_root_gets_sudo_on_every_spark_and_still_plans(tmp_path, keys):  # noqa: F811
    inventory = _init(tmp_path, "--ssh-user", "nvidia")
    hosts = dict(load_hosts(str(inventory)))
    assert {name: (d["ssh_user"], d.get("_sudo")) for name, d in hosts.items()} == \
        {"spark-a": ("nvidia", True), "spark-b": ("nvidia", True)}
    assert "docs/prepare-a-spark.md" in inventory.read_text()  # the inventory says how the Spark is prepared
    assert cli.main(["plan", str(inventory), "--offline", "--json"]) == 0  # `_sudo` is pyinfra's, not refused


def test_root_gets_no_sudo(tmp_path, keys):  # noqa: F811
    inventory = _init(tmp_path)
    assert {d.get("_sudo") for _, d in load_hosts(str(inventory))} == {None}
    assert '"_sudo"' not in inventory.read_text()


def test_pyinfra_escalates_every_command_of_the_sudo_user(tmp_path, keys):  # noqa: F811
    """pyinfra reads `_sudo` from the host's data as the default of its global arguments: the facts, the operations
    and the uploads of every stage (and the progress watch, controller/progress.py) run under `sudo -n`."""
    inventory = _init(tmp_path, "--ssh-user", "nvidia")
    state, config = State(check_for_changes=False), Config()
    state.cwd = str(inventory.parent)
    with ctx_state.use(state), ctx_config.use(config):  # as fleet/converge.py `connected` loads an inventory
        made = make_inventory(str(inventory), cwd=str(inventory.parent))
        with ctx_inventory.use(made):
            state.init(made, config)
            arguments, _ = pop_global_arguments(state, made.get_host("spark-a"), {})
    assert arguments["_sudo"] is True and not arguments.get("_sudo_user")  # to root: secrets go through a 0700 dir


def test_logs_reads_the_journal_through_sudo(tmp_path, keys):  # noqa: F811
    """The journal is root's (or the adm group's): `sparkfleet logs` runs journalctl under `sudo -n` for that user."""
    data = dict(load_hosts(str(_init(tmp_path, "--ssh-user", "nvidia"))))["spark-a"]
    argv = logs_argv("spark-a", data, "engine", [])
    assert argv[argv.index("-l") + 1] == "nvidia" and argv[-1].startswith("sudo -n journalctl ")


@pytest.mark.parametrize("user", ["root", "nvidia", "ops-1"])
def test_the_inventory_stays_python_whatever_the_user(tmp_path, user):
    text = render_inventory([], user, tmp_path / "office.json", None)
    compile(text, "inventory.py", "exec")
    assert ('"_sudo": True' in text) == (user != "root")
