"""A tensor-parallel group's members (two Sparks, one model over Ray): each runs its Ray node from the plan's unit,
the head's Ray sees every member's fabric address with one GPU, and a worker runs no vLLM unit. The model on each
member is checked by test_converged.py (every host, workers included). A fleet with no group deselects these."""

import json
import shlex

import pytest

from sparkfleet.contract import paths

from .conftest import container_sees_the_gpu


def test_ray_unit_is_the_plans_enabled_and_active(member):
    assert member.host.file(paths.RAY_UNIT_PATH).content_string == member.plan.render_ray_unit()
    service = member.host.service(paths.RAY_UNIT_NAME)
    assert service.is_enabled and service.is_running


def test_ray_container_sees_the_gpu(member):
    container_sees_the_gpu(member, paths.RAY_CONTAINER)


def test_ray_sees_every_member_with_one_gpu(member):
    """Asked on each member (the head's cluster, through its own raylet): every member's fabric address alive,
    one GPU each, and nothing else."""
    group = member.plan.group
    command = ["python3", paths.RAY_CHECK, "--address", group.ray_address,
               "--node-ip", group.address_of(member.plan.name)]
    for name, address in zip(group.members, group.addresses):
        command += ["--member", f"{name}={address}"]
    check = member.host.run(shlex.join(command))
    seen = json.loads(check.stdout.splitlines()[-1])
    assert check.rc == 0 and seen["missing"] == [], (check.stdout, check.stderr)
    assert seen["alive_nodes"] == group.size
    assert sorted(zip(seen["addresses"], seen["gpus"])) == sorted((address, 1) for address in group.addresses)


def test_a_worker_runs_no_vllm_unit(member):
    if member.plan.runs_engine:
        pytest.skip(f"{member.plan.name} is the head of {member.plan.group.name}: test_converged.py checks its unit")
    assert not member.host.file(paths.UNIT_PATH).exists
    assert not member.host.service(paths.UNIT_NAME).is_running
    assert member.host.run(f"docker ps -q --filter name=^{member.s.container_name}$").stdout.strip() == ""
