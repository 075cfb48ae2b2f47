"""The testinfra suite reads the same pyinfra inventory as the deploy.

    pytest tests/infra --inventory inventory/office.py [--full-verify] [--limit HOST|GROUP]

Hosts and SSH details come from the inventory; what each host should hold
comes from the same plan the deploy used (settings + the hub's manifest).
"""

from __future__ import annotations

import shlex

import pytest
import testinfra

from sparkfleet.fleet.inventory import load_hosts
from sparkfleet.model.hubs import hub_resolver
from sparkfleet.release.plan import plan_hosts


def pytest_addoption(parser):
    group = parser.getgroup("sparkfleet")
    group.addoption("--inventory", help="pyinfra inventory file of the fleet to verify")
    group.addoption("--limit", default=None, help="one host or group of the inventory")
    group.addoption("--full-verify", action="store_true", help="re-hash every model file on the hosts")


def _plans(config):
    inventory = config.getoption("--inventory")
    if not inventory:
        raise pytest.UsageError("tests/infra needs --inventory inventory/<fleet>.py")
    if not hasattr(config, "_sparkfleet_plans"):
        hosts = dict(load_hosts(inventory, config.getoption("--limit")))
        config._sparkfleet_plans = [(plan, hosts[plan.name]) for plan in plan_hosts(list(hosts.items()), resolve=hub_resolver)]
    return config._sparkfleet_plans


def pytest_generate_tests(metafunc):
    if "spark" in metafunc.fixturenames:
        plans = _plans(metafunc.config)
        metafunc.parametrize("spark", plans, ids=[plan.name for plan, _ in plans], indirect=True)


class Spark:
    """One host under test: its plan and a testinfra connection over the inventory's SSH details."""

    def __init__(self, plan, data):
        self.plan, self.s = plan, plan.settings
        port = data.get("ssh_port", 22)
        spec = f"ssh://{data.get('ssh_user', 'root')}@{data.get('ssh_hostname', plan.name)}:{port}"
        self.host = testinfra.get_host(spec, ssh_identity_file=data.get("ssh_key"),
                                       ssh_extra_args=host_key_options(data))


def host_key_options(data: dict) -> str:
    """OpenSSH options for the inventory's host-key policy: the suite checks keys as strictly as the deploy."""
    options = ["-o LogLevel=ERROR", f"-o StrictHostKeyChecking={data.get('ssh_strict_host_key_checking', 'yes')}"]
    if data.get("ssh_known_hosts_file"):
        options.append(f"-o UserKnownHostsFile={shlex.quote(data['ssh_known_hosts_file'])}")
    return " ".join(options)


@pytest.fixture(scope="session")
def _connections():
    return {}


@pytest.fixture
def spark(request, _connections):
    plan, data = request.param
    if plan.name not in _connections:
        _connections[plan.name] = Spark(plan, data)
    return _connections[plan.name]


@pytest.fixture
def full_verify(request):
    return request.config.getoption("--full-verify")
