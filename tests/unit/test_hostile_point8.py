"""Issue 19, item 8: the smaller holes, each with the hostile input that opened it.

ssh_hostname as the LAN address; engine-, hub- and host-controlled strings printed as rich markup; a hub's
config.json numbers; a rollback's engine environment; a secret staged under `_sudo`; the hub token of a
controller copy.
"""

import pytest

from sparkfleet.fleet.front_door import front_door_plan
from sparkfleet.release.plan import plan_hosts
from sparkfleet.release.settings import SettingsError, parse_settings

from .helpers import host_data

# --- ssh_hostname: the LAN address a peer URL, the front door and status build on ----------------------------

INJECTED = "10.0.0.9:8000 check\n    server evil 203.0.113.7:80"


@pytest.mark.parametrize("hostname", [INJECTED, "10.0.0.9\n", "spark a", "spark;id", "[fd00::9]", "", 10])
def test_hostile_ssh_hostname_is_refused_before_any_config_is_rendered(hostname):
    hosts = [(name, host_data(ssh_hostname=hostname if name == "spark-2" else "10.0.0.8", api_host="0.0.0.0",
                              api_key="k" * 16, front_door_users={"alice": "a" * 16}))
             for name in ("spark-1", "spark-2")]
    with pytest.raises(SettingsError) as caught:
        plans = {p.name: p for p in plan_hosts(hosts)}
        front_door_plan("spark-1", plans).config()  # never reached: the plan is refused first
    [line] = caught.value.problems
    assert line.startswith(f"spark-2: ssh_hostname = {hostname!r} is invalid: ") and "fix it in the inventory" in line


def test_status_refuses_it_too():
    with pytest.raises(SettingsError, match=r"^spark-2: ssh_hostname = .* is invalid: contains the control character"):
        parse_settings("spark-2", host_data(ssh_hostname=INJECTED))


@pytest.mark.parametrize("hostname", ["spark-1.lan", "10.0.0.9", "fd00::9", "localhost"])
def test_ordinary_ssh_hostnames_plan_and_become_the_lan_address(hostname):
    [plan] = plan_hosts([("spark-1", host_data(ssh_hostname=hostname))])
    assert plan.lan_address == hostname
