"""The guard on every host that runs an engine: what the plan renders, its key root-only, running."""

from __future__ import annotations

import pytest

from sparkfleet.contract import paths
from sparkfleet.roles import guard as gd

from .conftest import chat_ui_of


@pytest.fixture
def guard(spark, request):
    ui = chat_ui_of(request.config)
    planned = gd.guard_plan(spark.plan, runs_chat_ui=ui is not None and ui.host == spark.plan.name)
    if planned is None:
        pytest.skip(f"{spark.plan.name} runs no engine: no guard")
    return planned


def test_config_and_unit_on_disk_are_the_plans(spark, guard):
    assert spark.host.file(paths.GUARD_CONFIG).content_string == guard.config()
    assert spark.host.file(paths.GUARD_UNIT_PATH).content_string == guard.unit()


def test_key_map_is_root_only(spark, guard):
    key_map = spark.host.file(paths.GUARD_KEY_MAP)
    assert key_map.user == "root" and key_map.mode == 0o600


def test_guard_active_as_its_own_user(spark, guard):
    service = spark.host.service(paths.GUARD_UNIT_NAME)
    assert service.is_enabled and service.is_running
    workers = spark.host.check_output(f"ps -o user= --ppid $(systemctl show -p MainPID --value {paths.GUARD_UNIT_NAME})")
    assert set(workers.split()) == {"haproxy"}
