"""How a host is reached (contract/reach.py): the controller's rule (`ssh_hostname`, else the inventory's name) for
SSH and its own HTTP asks, the LAN's (`lan_address`, else the controller's) for what the hosts point at each
other; an inventory that names its hosts by address alone works for both. And `group_hosts`, the one way the
fleet finds a group's hosts (the front doors, the monitoring hosts)."""

from __future__ import annotations

import shlex

from sparkfleet.contract import reach
from sparkfleet.contract.settings import parse_settings
from sparkfleet.fleet import logs, speed
from sparkfleet.roles.front_door.plan import front_door_plan
from sparkfleet.controller.inventory import group_hosts
from sparkfleet.release.plan import plan_hosts

from .helpers import KEY, host_data

LAN_API = {"api_host": "0.0.0.0", "api_key": KEY}


def bare(**overrides) -> dict:
    """A host's data as an inventory of bare addresses gives it: no ssh_hostname."""
    return {k: v for k, v in host_data(**overrides).items() if k != "ssh_hostname"}


def test_the_controller_reaches_a_host_at_ssh_hostname_else_at_its_inventory_name():
    assert reach.ssh_address("spark-1", {"ssh_hostname": "10.0.0.5"}) == "10.0.0.5"
    assert reach.ssh_address("10.0.0.11", {}) == "10.0.0.11"
    assert reach.ssh_address("spark-1", {"ssh_hostname": None}) == "spark-1"


def test_the_lan_reaches_a_host_at_its_lan_address_else_where_the_controller_does():
    data = host_data(lan_address="192.168.1.5")  # ssh_hostname 10.0.0.9: the controller's way in
    assert reach.lan_address("spark-1", data, parse_settings("spark-1", data)) == "192.168.1.5"
    data = host_data()
    assert reach.lan_address("spark-1", data, parse_settings("spark-1", data)) == "10.0.0.9"
    data = bare()
    assert reach.lan_address("10.0.0.11", data, parse_settings("10.0.0.11", data)) == "10.0.0.11"


def test_an_inventory_of_bare_addresses_gives_whole_urls():
    data = bare(**LAN_API)
    s = parse_settings("10.0.0.11", data)
    assert reach.api_url("10.0.0.11", s, data) == "http://10.0.0.11:8000"
    assert reach.front_door_url("10.0.0.11", s, data) == f"http://10.0.0.11:{s.front_door_port}"


def test_the_controllers_urls_honour_their_settings():
    data = host_data(**LAN_API)
    s = parse_settings("spark-1", data)
    assert reach.api_url("spark-1", s, data) == "http://10.0.0.9:8000"  # ssh_hostname, not the name
    over = host_data(**LAN_API, controller_api_url="http://127.0.0.1:18000/",
                     controller_front_door_url="https://door.example:8443/")
    s = parse_settings("spark-1", over)
    assert reach.api_url("spark-1", s, over) == "http://127.0.0.1:18000"
    assert reach.front_door_url("spark-1", s, over) == "https://door.example:8443"
    loopback = host_data(api_host="127.0.0.1")
    s = parse_settings("spark-1", loopback)
    assert reach.api_url("spark-1", s, loopback) is None and not reach.api_reachable(s)


def test_an_ipv6_address_is_bracketed_in_a_url():
    assert reach.http_url("fd00::5", 8000) == "http://[fd00::5]:8000"
    assert reach.http_url("10.0.0.5", 8443, "https") == "https://10.0.0.5:8443"
    assert reach.http_url("spark-a.lan", 8000) == "http://spark-a.lan:8000"


SSH = {"ssh_hostname": "10.0.0.1", "ssh_user": "admin", "ssh_port": 2222, "ssh_key": "/home/me/.ssh/spark",
       "ssh_config_file": "/srv/office/ssh_config", "ssh_strict_host_key_checking": "yes",
       "ssh_known_hosts_file": "/srv/my office/known_hosts"}


def test_one_ssh_command_line_carries_every_inventory_setting_and_ends_with_the_address():
    assert reach.ssh_command("spark-a", SSH, "-N") == [
        "ssh", "-N", "-p", "2222", "-l", "admin", "-i", "/home/me/.ssh/spark", "-F", "/srv/office/ssh_config",
        "-o", "StrictHostKeyChecking=yes", "-o", 'UserKnownHostsFile="/srv/my office/known_hosts"',
        "-o", "ConnectTimeout=10", "--", "10.0.0.1"]
    assert reach.ssh_command("10.0.0.11", {}) == ["ssh", "-o", "ConnectTimeout=10", "--", "10.0.0.11"]


def test_logs_and_the_speed_gates_forward_build_on_that_one_command_line():
    assert logs.ssh_argv("spark-a", SSH, ["true"])[:-1] == reach.ssh_command("spark-a", SSH)
    forward = speed.forward_command("spark-a", SSH, 40001, 8000)
    assert forward[forward.index("-L") + 2:] == reach.ssh_command("spark-a", SSH)[1:]  # the forward's options first
    assert shlex.split(logs.ssh_argv("10.0.0.11", {}, ["true"])[-1]) == ["true"]
    assert logs.ssh_argv("10.0.0.11", {}, ["true"])[-2] == "10.0.0.11"
    assert speed.forward_command("10.0.0.11", {}, 1, 2)[-1] == "10.0.0.11"


def test_plans_and_the_front_door_point_the_lan_at_a_bare_address():
    base = {**LAN_API, "front_door_users": {"alice": "alice-key-0123456789abcdef"}, "front_door_allow_http": True}
    plans = {p.name: p for p in plan_hosts([("10.0.0.11", bare(**base)), ("10.0.0.12", bare(**base))],
                                           resolve=False)}
    assert [p.lan_address for p in plans.values()] == ["10.0.0.11", "10.0.0.12"]
    door = front_door_plan("10.0.0.11", plans)
    assert [b.target for b in door.backends] == ["10.0.0.11:8000", "10.0.0.12:8000"]


def test_group_hosts_are_a_groups_hosts_in_order_and_none_without_the_group(tmp_path):
    inventory = tmp_path / "office.py"
    inventory.write_text("sparks = [('spark-1', {'ssh_hostname': '10.0.0.1'}), ('spark-2', {})]\n"
                         "front_door = [('door-1', {'ssh_hostname': '10.0.0.9'})]\n")
    assert [name for name, _ in group_hosts(str(inventory), "front_door")] == ["door-1"]
    assert [name for name, _ in group_hosts(str(inventory), "sparks")] == ["spark-1", "spark-2"]
    assert group_hosts(str(inventory), "front_door")[0][1]["ssh_hostname"] == "10.0.0.9"
    assert group_hosts(str(inventory), "monitoring") == []
    assert group_hosts(str(tmp_path / "missing.py"), "front_door") == []


def test_a_peers_share_url_brackets_an_ipv6_lan_address():
    (plan,) = plan_hosts([("spark-1", host_data(lan_address="fd00::5"))], resolve=False)
    assert plan.lan_address == "fd00::5"
    assert plan.share_url.startswith(f"http://[fd00::5]:{plan.settings.peer_port}/")
