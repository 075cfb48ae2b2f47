"""Issue 49: rollout, upgrade and rollback run their batches through one loop, so the rollout's rule holds for all
three: a batch that would drain the last backend a front door has in rotation for a model another host serves is
refused before any host is touched, in one line naming the door, the host, the model and the fix.

No converge is needed for the refusal: spark-2 and spark-3 are set aside with `sparkfleet drain`, which leaves
spark-1 the model's last backend on door-1; an upgrade of spark-1 (given something to do: the host's own
reboot-required flag, so the sim's shared apt repository is not touched) and a rollback of spark-1 are tried; both
drains are undone in a finally, so the fleet is left as found.
"""

from __future__ import annotations

import subprocess

import pytest

from sparkfleet.contract import paths
from sparkfleet.roles.front_door.records import BACKEND

from tests.waiting import wait_until

from . import test_front_door
from .conftest import HOSTS, container, ssh, started_at
from .test_front_door import DOOR, MODEL, backend_states, sparkfleet

pytestmark = pytest.mark.e2e
door = test_front_door.door  # the fleet converged with its front door on door-1

LAST = "spark-1"  # the model's last backend in rotation once the others are drained
OTHERS = ("spark-2", "spark-3")
ASIDE = {LAST: "in", **{h: "drained" for h in OTHERS}}


def boots() -> dict[str, int]:
    """How many times each simulated Spark booted again (its container's restarts: an in-host reboot is one)."""
    return {h: int(subprocess.run(["docker", "inspect", "-f", "{{.RestartCount}}", container(h)], capture_output=True,
                                  text=True, check=True).stdout) for h in HOSTS}


def untouched(state: dict) -> dict:
    """What a refused command must leave as it was: each Spark's release record and engine start, the Sparks'
    boots, and door-1's holds (a drain by a command holds its backend first)."""
    return {"records": {h: ssh(state, h, f"cat {paths.RELEASE_FILE}") for h in HOSTS},
            "engines": {h: started_at(state, h) for h in HOSTS}, "boots": boots(),
            "holds": ssh(state, DOOR, f"cat {paths.FRONT_DOOR_HOLDS} 2>/dev/null || true")}


def refusal(proc) -> str:
    """The command's one refusal line (without its `sparkfleet: ` prefix); it must be the only such line."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith("sparkfleet: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0].removeprefix("sparkfleet: ")


def test_an_upgrade_and_a_rollback_that_would_drain_a_models_last_backend_are_refused_before_any_host(door,
                                                                                                      sim_fleet):
    inventory, _ = door
    drained, flagged = [], False
    try:
        for host in OTHERS:
            done = sparkfleet("drain", inventory, host, "--json", timeout=300)
            assert done.returncode == 0, done.stderr[-2000:]
            drained.append(host)
        wait_until(lambda: backend_states(inventory) == ASIDE, 60, "spark-1 the last backend in rotation")
        if ssh(sim_fleet, LAST, f"test -e {paths.REBOOT_REQUIRED} && echo flagged || true") != "flagged":
            ssh(sim_fleet, LAST, f"touch {paths.REBOOT_REQUIRED}")  # the upgrade's survey: a reboot to do
            flagged = True
        before = untouched(sim_fleet)
        assert LAST not in before["holds"], before["holds"]
        for command, then in (("upgrade", "upgrade"), ("rollback", "roll back")):
            proc = sparkfleet(command, inventory, "--limit", LAST, *(["--no-speed-gate"] if command == "upgrade"
                                                                     else []), timeout=600)
            assert proc.returncode == 1, (command, proc.stdout[-2000:], proc.stderr[-3000:])
            assert refusal(proc) == (
                f"front door {DOOR}: draining {LAST} leaves its backend {BACKEND} ({MODEL}) with no server in "
                f"rotation, though {', '.join(OTHERS)} serve {MODEL} too: converge the front door first (pyinfra -y "
                f"{inventory} deploy.py --limit {DOOR}), or bring them back in rotation, then {then}"), command
            assert f"{LAST} out" not in proc.stderr and "batch 1/" not in proc.stderr, proc.stderr[-3000:]
            assert backend_states(inventory) == ASIDE, command  # nothing drained, nothing put back
            assert untouched(sim_fleet) == before, command  # no release switched, no engine restarted, no reboot
    finally:
        if flagged:
            ssh(sim_fleet, LAST, f"rm -f {paths.REBOOT_REQUIRED}", check=False)
        undrained = [sparkfleet("undrain", inventory, host, "--json", timeout=300) for host in drained]
    assert all(proc.returncode == 0 for proc in undrained), [proc.stderr[-2000:] for proc in undrained]
    wait_until(lambda: backend_states(inventory) == {h: "in" for h in HOSTS}, 60, "every Spark back in rotation")
