"""The testinfra suite reads the same pyinfra inventory as the deploy.

    pytest tests/infra --inventory inventory/office.py [--full-verify] [--limit HOST|GROUP]

Hosts and SSH details come from the inventory; what each host should hold
comes from the same plan the deploy used (settings + the hub's manifest).
"""

from __future__ import annotations

import os
import shlex
import tempfile

import pytest
import testinfra

from sparkfleet.controller.inventory import NotInInventory, load_hosts
from sparkfleet.model.hubs import hub_resolver
from sparkfleet.release.image import image_resolver
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
        hosts = dict(load_hosts(inventory))  # the whole inventory: a front door's backends are other hosts
        plans = plan_hosts(list(hosts.items()), resolve=hub_resolver, resolve_image=image_resolver)
        chosen = {name for name, _ in load_hosts(inventory, config.getoption("--limit"))}
        config._sparkfleet_all_plans = {plan.name: plan for plan in plans}
        config._sparkfleet_plans = [(plan, hosts[plan.name]) for plan in plans if plan.name in chosen]
    return config._sparkfleet_plans


# fixture -> the hosts it is given: the Sparks, every host (a front door may be either), a group's members, the
# service hosts (front door, monitoring: no GPU, no engine), the chat UI's host
CHOSEN = {"spark": lambda plan, ui: not plan.is_service, "node": lambda plan, ui: True,
          "member": lambda plan, ui: plan.group, "service_host": lambda plan, ui: plan.is_service,
          "chat_ui_host": lambda plan, ui: ui is not None and ui.host == plan.name}
OPTIONAL = ("member", "service_host", "chat_ui_host")  # a fleet without any: their checks are deselected


def pytest_generate_tests(metafunc):
    for name, chosen in CHOSEN.items():
        if name in metafunc.fixturenames:
            ui = chat_ui_of(metafunc.config) if name == "chat_ui_host" else None
            hosts = [(plan, data) for plan, data in _plans(metafunc.config) if chosen(plan, ui)]
            if hosts or name not in OPTIONAL:
                metafunc.parametrize(name, hosts, ids=[plan.name for plan, _ in hosts], indirect=True)
            return


def pytest_collection_modifyitems(config, items):
    """The checks of tensor-parallel members and of service hosts are left out of a fleet without any
    (deselected, not skipped: a single-host fleet's pass and skip counts stay what they were)."""
    idle = [item for item in items if set(OPTIONAL) & set(getattr(item, "fixturenames", ()))
            and not hasattr(item, "callspec")]
    if idle:
        config.hook.pytest_deselected(items=idle)
        items[:] = [item for item in items if item not in idle]


class Spark:
    """One host under test: its plan and a testinfra connection over the inventory's SSH details, one SSH
    connection per host for the whole run (OpenSSH's multiplexing: testinfra asks ControlMaster, which does
    nothing without a ControlPath; a new handshake per check doubled the suite's time)."""

    def __init__(self, plan, data, socket: str):
        self.plan, self.s = plan, plan.settings
        port = data.get("ssh_port", 22)
        spec = f"ssh://{data.get('ssh_user', 'root')}@{data.get('ssh_hostname', plan.name)}:{port}"
        self.host = testinfra.get_host(spec, ssh_identity_file=data.get("ssh_key"),
                                       ssh_extra_args=host_key_options(data),
                                       controlpath=socket)


def host_key_options(data: dict) -> str:
    """OpenSSH options for the inventory's host-key policy: the suite checks keys as strictly as the deploy."""
    options = ["-o LogLevel=ERROR", f"-o StrictHostKeyChecking={data.get('ssh_strict_host_key_checking', 'yes')}"]
    if data.get("ssh_known_hosts_file"):
        options.append(f"-o UserKnownHostsFile={shlex.quote(data['ssh_known_hosts_file'])}")
    return " ".join(options)


@pytest.fixture(scope="session")
def _connections():
    """The hosts' connections, their control sockets in a private directory (short: a socket path has ~100
    bytes); the masters end ControlPersist (60 s) after the last check."""
    with tempfile.TemporaryDirectory(prefix="sparkfleet-ssh-") as sockets:
        yield {"sockets": sockets}


def _connected(request, connections: dict) -> Spark:
    plan, data = request.param
    if plan.name not in connections:
        connections[plan.name] = Spark(plan, data, os.path.join(connections["sockets"], str(len(connections))))
    return connections[plan.name]


@pytest.fixture
def spark(request, _connections):
    return _connected(request, _connections)


@pytest.fixture
def member(request, _connections):
    """A member of a tensor-parallel group (only members are given: see pytest_generate_tests)."""
    return _connected(request, _connections)


@pytest.fixture
def node(request, _connections):
    """Any host of the inventory, a Spark or a service host."""
    return _connected(request, _connections)


@pytest.fixture
def service_host(request, _connections):
    """A service host (only service hosts are given)."""
    return _connected(request, _connections)


@pytest.fixture
def chat_ui_host(request, _connections):
    """The host of the group chat_ui (only it is given)."""
    return _connected(request, _connections)


@pytest.fixture
def engine(spark):
    """A host that runs the vLLM unit: a single host or a group's head (a worker lends its GPU through Ray)."""
    if not spark.plan.runs_engine:
        pytest.skip(f"{spark.plan.name} is a worker of {spark.plan.group.name}: it runs no vLLM unit "
                    "(test_group.py checks its Ray node)")
    return spark


@pytest.fixture
def full_verify(request):
    return request.config.getoption("--full-verify")


def container_sees_the_gpu(spark: Spark, container: str) -> None:
    """The GPU inside a running container, not just on the host (a daemon-reload or a stale CDI spec loses it)."""
    listed = spark.host.run(f"docker exec {shlex.quote(container)} nvidia-smi -L")
    assert listed.rc == 0 and listed.stdout.startswith("GPU 0: "), (container, listed.stdout, listed.stderr)


def chat_ui_of(config):
    """The inventory's chat UI (roles/chat_ui.py), or None without a group chat_ui."""
    from sparkfleet.contract.paths import CHAT_UI_GROUP
    from sparkfleet.roles.chat_ui import chat_ui_plan

    _plans(config)
    try:
        names = [name for name, _ in load_hosts(config.getoption("--inventory"), CHAT_UI_GROUP)]
    except NotInInventory:  # no such group
        names = []
    return chat_ui_plan(names, config._sparkfleet_all_plans)
