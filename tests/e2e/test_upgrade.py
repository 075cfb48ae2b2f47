"""`sparkfleet upgrade` on the simulated fleet (issue 22): a newer stand-in NVIDIA driver published into the sim's
DGX OS repository, refused at the canary, then rolled in with reboots through the front door; the fleet is put back
on the original driver (no reboot cycle), the repository holding only it, nothing drained.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import HOSTS, ROOT, container, ssh
from . import test_front_door
from .test_front_door import USERS, Probe, backend_states, chat, deploy, sparkfleet, wait_until
from .test_lock import sim

pytestmark = pytest.mark.e2e
door = test_front_door.door  # the fleet converged with its front door on door-1 (a service host: never upgraded)

NEW = "580.95.99"
PACKAGE_CHANGE = f"nvidia-driver-580-open 580.95.05-1 -> {NEW}-1"


def drivers(state) -> dict[str, str]:
    """Each host's driver as nvidia-smi reports it (what preflight reads)."""
    return {h: ssh(state, h, "nvidia-smi --query-gpu=driver_version --format=csv,noheader") for h in HOSTS}


def boots() -> dict[str, int]:
    """How many times each simulated Spark booted again (its container's restarts: an in-host reboot is one)."""
    return {h: int(subprocess.run(["docker", "inspect", "-f", "{{.RestartCount}}", container(h)], capture_output=True,
                                  text=True, check=True).stdout) for h in HOSTS}


def door_now(tmp_path) -> tuple[str, str]:
    """The front door's inventory and URL again (door-1 is not rebooted by an upgrade, so they stay the same; the
    inventory is written again for the hosts' new state)."""
    return (test_front_door.door_inventory(tmp_path, "door-now", USERS),
            f"http://127.0.0.1:{test_front_door.door_port()}")


def upgrade_through(probe: Probe, *args: str) -> tuple[int, dict, str]:
    """`sparkfleet upgrade ARGS --json` while `probe` chats through the front door on door-1, which no upgrade
    reboots: the probe runs through every Spark's batch."""
    proc = subprocess.Popen([sys.executable, "-m", "sparkfleet", "upgrade", *args, "--json"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err = []
    for line in proc.stderr:
        err.append(line)
    out = proc.stdout.read()
    return proc.wait(timeout=900), json.loads(out), "".join(err)


def test_upgrade_refused_at_the_canary_then_a_new_driver_everywhere_with_one_reboot_each_and_no_failed_request(
        door, sim_fleet, tmp_path):
    inventory, url = door
    started, canary = boots(), "spark-1"  # the canary: the first Spark (the front door runs on door-1)
    sim("publish-driver", NEW)
    try:
        dry = sparkfleet("upgrade", inventory, "--dry", "--json", timeout=300)
        assert dry.returncode == 0, dry.stderr[-3000:]
        assert {h["host"]: (h["changes"], h["reboot"]) for h in json.loads(dry.stdout)["hosts"]} == \
            {h: ([PACKAGE_CHANGE], True) for h in HOSTS}

        refused = sparkfleet("upgrade", inventory, "--batch", "1", "--json", "--data",
                             f'refused_drivers={{"{NEW}*": "sim: known bad"}}', timeout=600)
        report = {h["host"]: h for h in json.loads(refused.stdout)["hosts"]}
        assert refused.returncode == 1, refused.stderr[-3000:]
        assert (f"{canary}: nvidia-driver-580-open {NEW}-1 (NVIDIA driver {NEW}) is refused (refused_drivers "
                f"'{NEW}*'): sim: known bad") in refused.stderr, refused.stderr[-3000:]
        assert {h: r["result"] for h, r in report.items()} == \
            {"spark-1": "refused", "spark-2": "not reached", "spark-3": "not reached"}
        assert drivers(sim_fleet)[canary] == "580.95.05" and backend_states(inventory)[canary] != "in"
        assert boots() == started

        with Probe(url, USERS["alice"]) as probe:
            probe.wait_for(10, "requests through the door before the upgrade")  # 2 s of them at 5/s
            code, report, err = upgrade_through(probe, inventory, "--batch", "1")
        assert code == 0, err[-4000:]
        assert f"front door: {canary} held by an operation that is gone: putting back" in err, err[-3000:]
        assert [(h["host"], h["result"], h["changes"], h["rebooted"]) for h in report["hosts"]] == \
            [(h, "upgraded", [PACKAGE_CHANGE], True) for h in HOSTS]
        assert drivers(sim_fleet) == {h: NEW for h in HOSTS}
        [check] = report["speed_gate"]["checks"]  # the canary's release on the new driver against the old one's
        assert (check["host"], check["verdict"]) == (canary, "passed"), check
        assert boots() == {h: n + 1 for h, n in started.items()}
        assert probe.failures == [], f"{len(probe.failures)} of {len(probe.results)} failed: {probe.failures[:5]}"
        assert len(probe.results) >= 20, len(probe.results)
        inventory, url = door_now(tmp_path)
        wait_until(lambda: chat(url, USERS["alice"], [{"role": "user", "content": "hi"}], False, 1)[0] == 200, 60)

        again = sparkfleet("upgrade", inventory, "--json", timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        assert [h["result"] for h in json.loads(again.stdout)["hosts"]] == ["unchanged"] * 3
        assert boots() == {h: n + 1 for h, n in started.items()}
    finally:
        sim("reset-driver")
        inventory, url = door_now(tmp_path)
        if backend_states(inventory) != {h: "in" for h in HOSTS}:
            deploy(inventory, "--limit", test_front_door.DOOR)  # the front door's converge puts back a hold
    assert drivers(sim_fleet) == {h: "580.95.05" for h in HOSTS}
    wait_until(lambda: backend_states(inventory) == {h: "in" for h in HOSTS}, 60)
