"""`sparkfleet logs`: the ssh argv carries the inventory's SSH settings and one quoted journalctl command;
nothing is run here (os.execvp is replaced)."""

from __future__ import annotations

import shlex

import pytest

from sparkfleet import cli
from sparkfleet.commands import logs as logs_command
from sparkfleet.contract import paths
from sparkfleet.fleet import logs

SSH = {"ssh_hostname": "10.0.0.1", "ssh_user": "admin", "ssh_port": 2222, "ssh_key": "/home/me/.ssh/spark",
       "ssh_strict_host_key_checking": "yes", "ssh_known_hosts_file": "/srv/office/known_hosts"}


def test_argv_uses_the_inventory_ssh_settings_and_one_quoted_remote_command():
    argv = logs.logs_argv("spark-a", SSH, "engine", [], lines=50, follow=True)
    assert argv[:-2] == ["ssh", "-p", "2222", "-l", "admin", "-i", "/home/me/.ssh/spark",
                         "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=/srv/office/known_hosts", "--"]
    assert argv[-2] == "10.0.0.1"
    assert shlex.split(argv[-1]) == ["journalctl", "--no-pager", "--unit", paths.UNIT_NAME, "--lines", "50",
                                     "--follow"]


@pytest.mark.parametrize("choice,unit", [
    ("engine", "sparkfleet-vllm.service"), ("watchdog", paths.WATCHDOG_UNIT),
    ("front-door", paths.FRONT_DOOR_UNIT_NAME), ("ray", paths.RAY_UNIT_NAME), ("embed", "sparkfleet-vllm-embed.service"),
])
def test_unit_choices_map_to_their_systemd_units(choice, unit):
    assert logs.unit_for(choice, ["embed"]) == unit


def test_an_unknown_unit_names_the_choices():
    with pytest.raises(logs.LogsError, match=r"give one of engine, watchdog, front-door, ray.*service of this host \(embed\)"):
        logs.unit_for("rerank", ["embed"])


def test_a_known_hosts_path_with_a_space_stays_one_option_value():
    argv = logs.ssh_argv("spark-a", {"ssh_known_hosts_file": '/my office/"kh"'}, ["true"])
    assert argv[2] == 'UserKnownHostsFile="/my office/\\"kh\\""'


def test_minimal_host_data_and_sudo():
    argv = logs.ssh_argv("spark-a", {"_sudo": True}, logs.journal_command("x.service", as_json=True))
    assert argv[:3] == ["ssh", "--", "spark-a"]
    assert shlex.split(argv[3])[:3] == ["sudo", "-n", "journalctl"] and argv[3].endswith("--output json")


def test_a_hostile_unit_name_cannot_reach_the_remote_shell():
    argv = logs.ssh_argv("h", {}, logs.journal_command("x; rm -rf /"))
    assert shlex.split(argv[-1])[3] == "x; rm -rf /"


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "inv.py"
    path.write_text(f"sparks = [('spark-a', {{**{SSH!r}, 'api_host': '0.0.0.0', 'api_key': 'k' * 24, "
                    "'services': {'embed': {'recipe': 'qwen3-embedding-0.6b'}}}), ('spark-b', {})]\n")
    return str(path)


@pytest.fixture
def execs(monkeypatch):
    ran = []

    def fake(file, argv):
        ran.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr(logs_command.os, "execvp", fake)
    return ran


def test_cli_runs_ssh_with_the_service_unit_and_no_secret(inventory, execs):
    with pytest.raises(SystemExit):
        cli.main(["logs", inventory, "spark-a", "--unit", "embed", "-n", "20"])
    [argv] = execs
    assert argv[0] == "ssh" and "sparkfleet-vllm-embed.service" in argv[-1] and "k" * 24 not in " ".join(argv)


@pytest.mark.parametrize("args,needle", [
    (["spark-z"], "no host named 'spark-z' in the inventory: its hosts are spark-a, spark-b"),
    (["spark-b", "--unit", "embed"], "(this host runs no RAG service)"),
    (["spark-a", "-n", "0"], "-n 0: give a positive number of lines"),
])
def test_cli_refuses_with_one_line(inventory, execs, capsys, args, needle):
    assert cli.main(["logs", inventory, *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and execs == []
