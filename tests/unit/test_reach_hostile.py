"""How the controller reaches a host, against hostile inventory values (issue 36, item 9): a value with spaces or
`-oProxyCommand=...` stays the value of its own option (read as OpenSSH's getopt reads the argv), the address comes
after `--`, a control character or a port that is no port is refused in one line, and ssh-keyscan never reads an
address as an option. And an inventory of bare addresses (no ssh_hostname) gives whole URLs and command lines for
status, the front door, logs, bench and the speed gate."""

from __future__ import annotations

import getopt
import shlex
from argparse import Namespace

import pytest
import requests

from sparkfleet.commands import bench as bench_command
from sparkfleet.contract import reach
from sparkfleet.contract.settings import parse_settings
from sparkfleet.fleet import logs, project, speed, status
from sparkfleet.fleet.front_door.commands import bench_target
from sparkfleet.controller.inventory import load_hosts
from sparkfleet.refused import Refused

from .helpers import KEY

OPENSSH = "1246ab:c:e:fgi:kl:m:no:p:qstvxAB:CD:E:F:GI:J:KL:MNO:P:Q:R:S:TVw:W:XYy"  # ssh.c's getopt string
HOSTILE = ["-oProxyCommand=touch /tmp/pwned", "a b -oProxyCommand=touch${IFS}/tmp/pwned", "-F/tmp/evil",
           "x\" -oProxyCommand=\"y", "--", "yes\\"]
KEYS = ["ssh_user", "ssh_key", "ssh_config_file", "ssh_known_hosts_file", "ssh_strict_host_key_checking"]


def ssh_reads(argv: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """(options, the rest) as OpenSSH's getopt reads `ssh ARGS`; each -o value as its config line splits it."""
    assert argv[0] == "ssh"
    options, rest = getopt.getopt(argv[1:], OPENSSH)
    for flag, value in options:
        if flag == "-o":
            assert len(shlex.split(value)) == 1, value  # one KEY=VALUE word: no second keyword on the line
    return options, rest


FLAGS = {"ssh_user": "-l", "ssh_key": "-i", "ssh_config_file": "-F"}
WORDS = {"ssh_strict_host_key_checking": "StrictHostKeyChecking", "ssh_known_hosts_file": "UserKnownHostsFile"}


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("value", HOSTILE)
def test_a_hostile_value_stays_the_value_of_its_own_option(key, value):
    argv = reach.ssh_command("spark-1", {"ssh_hostname": "10.0.0.1", key: value}, "-N")
    options, rest = ssh_reads(argv)
    assert rest == ["10.0.0.1"]
    assert options[-1] == ("-o", "ConnectTimeout=10")  # every SSH use has a connect timeout
    if key in FLAGS:
        assert options == [("-N", ""), (FLAGS[key], value), ("-o", "ConnectTimeout=10")]
    else:
        assert options[0] == ("-N", "") and [(f, shlex.split(v)[0]) for f, v in options[1:-1]] == \
            [("-o", f"{WORDS[key]}={value}")]


@pytest.mark.parametrize("name", ["-oProxyCommand=touch /tmp/pwned", "--", "-F/tmp/evil"])
def test_a_hostile_inventory_name_is_an_address_never_an_option(name):
    for argv in (reach.ssh_command(name, {}), logs.logs_argv(name, {}, "engine", []),
                 speed.forward_command(name, {}, 40001, 8000)):
        options, rest = ssh_reads(argv)
        assert rest[0] == name and all(flag in ("-N", "-o", "-L") for flag, _ in options)


@pytest.mark.parametrize("key,value", [("ssh_user", "root\n-oProxyCommand=x"), ("ssh_key", "/k\x1b[2J"),
                                       ("ssh_config_file", "/c\x00"), ("ssh_known_hosts_file", "/k\r"),
                                       ("ssh_strict_host_key_checking", "yes\n")])
def test_a_control_character_in_an_ssh_setting_is_refused_in_one_line(key, value):
    with pytest.raises(Refused) as refused:
        reach.ssh_command("spark-1", {"ssh_hostname": "10.0.0.1", key: value})
    line = str(refused.value)
    assert "\n" not in line and line.startswith(f"spark-1: `{key}`") and "inventory" in line
    assert "\x1b" not in line and "\x00" not in line and "\r" not in line


@pytest.mark.parametrize("port", ["22 -oProxyCommand=x", "-1", 0, 65536, "ssh", True, 22.5])
def test_a_port_that_is_no_port_is_refused_in_one_line(port):
    with pytest.raises(Refused, match=r"^spark-1: `ssh_port` = .* is not a TCP port \(1-65535\)"):
        reach.ssh_command("spark-1", {"ssh_port": port})
    with pytest.raises(Refused, match=r"`ssh_port`"):
        project.host_key_targets([("spark-1", {"ssh_port": port, "ssh_known_hosts_file": "/tmp/kh"})])
    assert reach.ssh_command("spark-1", {"ssh_port": "2222"})[1:3] == ["-p", "2222"]


def test_ssh_keyscan_reads_the_address_after_a_double_dash():
    argv = project.keyscan_argv(project.Spark("x", "-f/etc/hosts", 2222), 5)
    assert argv[-2:] == ["--", "-f/etc/hosts"] and argv[argv.index("-p") + 1] == "2222"


# --- an inventory of bare addresses ------------------------------------------------------------------------


@pytest.fixture
def bare_inventory(tmp_path):
    inventory = tmp_path / "bare.py"
    inventory.write_text(
        "sparks = ['10.0.0.11', '10.0.0.12']\n"
        "front_door = [('10.0.0.21', {'front_door_users': {'alice': 'alice-key-0123456789abcdef'},"
        " 'front_door_allow_http': True})]\n")
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text(f"api_host = '0.0.0.0'\napi_key = {KEY!r}\n"
                                                    "backend_key_in_clear = True\n")
    return str(inventory)


def test_bare_addresses_give_status_bench_and_the_speed_gate_their_urls(bare_inventory, monkeypatch):
    hosts = dict(load_hosts(bare_inventory))
    data = hosts["10.0.0.11"]
    assert "ssh_hostname" not in data
    s = parse_settings("10.0.0.11", data)
    asked = []

    def refused(url, *args):
        asked.append(url)
        raise requests.ConnectionError("loopback only: nothing asked")

    monkeypatch.setattr(status, "asked", refused)
    row = status.host_status("10.0.0.11", s, data)
    assert row["url"] == "http://10.0.0.11:8000" and asked == ["http://10.0.0.11:8000"]
    args = Namespace(url=None, target=bare_inventory, front_door=False, limit=None, model=None, roofline=1.0,
                     max_tokens=32)
    assert bench_command.target(args)[0] == "http://10.0.0.11:8000"
    with speed.reach("10.0.0.11", s, data) as url:
        assert url == "http://10.0.0.11:8000"


def test_bare_addresses_give_the_front_door_logs_and_the_forward_their_address(bare_inventory):
    url, _, key = bench_target(bare_inventory)
    hosts = dict(load_hosts(bare_inventory))
    s = parse_settings("10.0.0.21", hosts["10.0.0.21"])
    assert url == f"http://10.0.0.21:{s.front_door_port}" and key == "alice-key-0123456789abcdef"
    argv = logs.logs_argv("10.0.0.11", hosts["10.0.0.11"], "engine", [])
    assert ssh_reads(argv)[1][0] == "10.0.0.11" and shlex.split(argv[-1])[0] == "journalctl"
    assert ssh_reads(speed.forward_command("10.0.0.12", hosts["10.0.0.12"], 40001, 18000))[1] == ["10.0.0.12"]
