"""The front door on each host of the group `front_door` (a Spark or a service host): what the plan renders, keys
root-only, answering."""

from __future__ import annotations

import pytest

from sparkfleet.contract import paths
from sparkfleet.contract.monitoring import FRONT_DOOR_GROUP
from sparkfleet.roles.front_door import plan as fd_plan
from sparkfleet.fleet.front_door import runtime as fd_runtime
from sparkfleet.roles.front_door import records as fd_records
from sparkfleet.roles.front_door.address import door_set
from sparkfleet.controller.inventory import NotInInventory, load_hosts

from .conftest import chat_ui_of


@pytest.fixture
def door(node, request):
    """This host's front door plan; hosts outside the group `front_door` have none to check."""
    try:
        doors = [name for name, _ in load_hosts(request.config.getoption("--inventory"), FRONT_DOOR_GROUP)]
    except NotInInventory:  # no such group
        doors = []
    if node.plan.name not in doors:
        pytest.skip(f"{node.plan.name} is not in the group {FRONT_DOOR_GROUP}")
    plans = request.config._sparkfleet_all_plans
    return fd_plan.front_door_plan(node.plan.name, plans, doors=door_set(doors, plans),  # the doors as one set
                                   ui=chat_ui_of(request.config))


def test_config_and_unit_on_disk_are_the_plans(node, door):
    assert node.host.file(paths.FRONT_DOOR_CONFIG).content_string == door.config()
    assert node.host.file(paths.FRONT_DOOR_UNIT_PATH).content_string == door.unit()


def test_key_files_are_root_only(node, door):
    for path in (paths.FRONT_DOOR_USERS_MAP, paths.FRONT_DOOR_BACKEND_MAP):
        key_file = node.host.file(path)
        assert key_file.user == "root" and key_file.mode == 0o600, path


def test_front_door_active_and_every_backend_in(node, door):
    service = node.host.service(paths.FRONT_DOOR_UNIT_NAME)
    assert service.is_enabled and service.is_running
    states = fd_runtime.backend_states(node.host.check_output(fd_records.runtime_command("show stat")))
    assert {name: row["state"] for name, row in states.items()} == {b.name: "in" for b in door.backends}


def test_front_door_answers_and_refuses_a_request_without_key(node, door):
    url = f"{'https' if door.tls else 'http'}://127.0.0.1:{door.settings.front_door_port}"
    assert node.host.check_output(f"curl -sk -o /dev/null -w '%{{http_code}}' {url}/health") == "200"
    assert node.host.check_output(f"curl -sk -o /dev/null -w '%{{http_code}}' {url}/v1/models") == "401"
