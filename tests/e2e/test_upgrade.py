"""`sparkfleet upgrade` on the simulated fleet (issues 22 and 37): a newer stand-in NVIDIA driver published into the
sim's DGX OS repository, refused at the canary, then rolled in with reboots under load through two front doors
sharing the floating address, one of them on spark-3, which holds it: its reboot hands the address to door-1
first. The fleet is put back on the original driver (no reboot cycle), the repository holding only it, nothing
drained, and spark-3 a plain Spark again (its door removed by the converge of an inventory without it).
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys

import pytest

from .conftest import HOSTS, ROOT, container, ssh
from . import test_front_door
from .test_front_door import USERS, Probe, backend_states, chat, deploy, sparkfleet, wait_until
from .test_lock import sim
from .test_two_doors import Load, holder

pytestmark = pytest.mark.e2e
door = test_front_door.door  # the fleet converged with its front door on door-1 (a service host: never upgraded)

NEW = "580.95.99"
PACKAGE_CHANGE = f"nvidia-driver-580-open 580.95.05-1 -> {NEW}-1"
DOORS = ("spark-3", "door-1")  # spark-3 first: the higher VRRP priority, and the door an upgrade reboots
def drivers(state) -> dict[str, str]:
    """Each host's driver as nvidia-smi reports it (what preflight reads)."""
    return {h: ssh(state, h, "nvidia-smi --query-gpu=driver_version --format=csv,noheader") for h in HOSTS}


def boots() -> dict[str, int]:
    """How many times each simulated Spark booted again (its container's restarts: an in-host reboot is one)."""
    return {h: int(subprocess.run(["docker", "inspect", "-f", "{{.RestartCount}}", container(h)], capture_output=True,
                                  text=True, check=True).stdout) for h in HOSTS}


def door_now(tmp_path) -> tuple[str, str]:
    """door-1's single-door inventory and URL again (door-1 is not rebooted by an upgrade, so they stay the same;
    the inventory is written again for the hosts' new state)."""
    return (test_front_door.door_inventory(tmp_path, "door-now", USERS),
            f"http://127.0.0.1:{test_front_door.door_port()}")


def two_doors(tmp_path, state: dict) -> tuple[str, str]:
    """inventory/sim_front_door.py with a second door on spark-3 (the README's door on a Spark) beside door-1, both
    holding the LAN's floating address by turns; that inventory and the URL clients use (the floating address)."""
    settings = {"front_door_users": USERS, "drain_timeout_s": 30, "front_door_allow_http": True,
                "front_door_address": state["lan"]["floating_address"]}
    lan_ip = "{{(index .NetworkSettings.Networks %r).IPAddress}}" % state["lan"]["network"]
    path = tmp_path / "two-doors.py"
    path.write_text(
        "import runpy, subprocess\n"
        f"_sim = runpy.run_path({str(ROOT / 'inventory/sim_front_door.py')!r})\n"
        f"_door = {settings!r}\n"
        f"_ip = subprocess.run(['docker', 'inspect', '-f', {lan_ip.replace(chr(39), chr(34))!r}, "
        f"{container('spark-3')!r}], capture_output=True, text=True, check=True).stdout.strip()\n"
        "sparks = [(n, {**d, **_door, 'controller_front_door_url': f'http://{_ip}:8080'} if n == 'spark-3' else d)\n"
        "          for n, d in _sim['sparks']]\n"
        "front_door = ['spark-3', *[(n, {**d, **_door}) for n, d in _sim['front_door']]]\n"
        "monitoring = _sim['monitoring']\n")
    return str(path), f"http://{ipaddress.ip_interface(state['lan']['floating_address']).ip}:8080"


def upgrade_through(probe: Probe, *args: str) -> tuple[int, dict, str]:
    """`sparkfleet upgrade ARGS --json` while `probe` chats through door-1, which no upgrade reboots: the probe runs
    through every Spark's batch."""
    proc = subprocess.Popen([sys.executable, "-m", "sparkfleet", "upgrade", *args, "--json"], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    err = []
    for line in proc.stderr:
        err.append(line)
    out = proc.stdout.read()
    return proc.wait(timeout=900), json.loads(out), "".join(err)


def test_upgrade_refused_at_the_canary_then_a_new_driver_everywhere_with_one_reboot_each_and_no_failed_request(
        door, sim_fleet, tmp_path):
    """Two loads: the official openai client (its default retries, no streams) through the floating address,
    which spark-3's door holds, and chats and streams through door-1's own port. The upgrade reboots spark-3 last
    (it runs a door), handing the address to door-1 and draining spark-3's door first: no request of either
    fails (what was in flight to the floating address when it moved is reset and retried by the client)."""
    inventory, url = two_doors(tmp_path, sim_fleet)
    doors = deploy(inventory)
    assert doors.returncode == 0, doors.stdout[-3000:] + doors.stderr[-3000:]
    started, canary = boots(), "spark-1"  # the canary: the first Spark (the doors' host spark-3 goes last)
    sim("publish-driver", NEW)
    try:
        # spark-3 holds the address (the higher priority; a door-1 that took it first hands it over)
        if wait_until(lambda: holder(sim_fleet, DOORS), 30, "a door holds the floating address") != "spark-3":
            ssh(sim_fleet, "door-1", "systemctl restart sparkfleet-door-address.service")
        wait_until(lambda: holder(sim_fleet, DOORS) == "spark-3", 30, "spark-3 holds the floating address")
        wait_until(lambda: chat(url, USERS["alice"], [{"role": "user", "content": "hi"}], False, 1)[0] == 200, 60,
                   "the floating address answers", ignore=(Exception,))
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

        door_1 = f"http://127.0.0.1:{test_front_door.door_port()}"
        with Probe(door_1, USERS["alice"]) as probe, Load(url, USERS["bob"]) as load:
            probe.wait_for(10, "requests through door-1 before the upgrade")  # 2 s of them at 5/s
            code, report, err = upgrade_through(probe, inventory, "--batch", "1")
        assert code == 0, err[-4000:]
        assert f"front door: {canary} held by an operation that is gone: putting back" in err, err[-3000:]
        assert [(h["host"], h["result"], h["changes"], h["rebooted"]) for h in report["hosts"]] == \
            [(h, "upgraded", [PACKAGE_CHANGE], True) for h in HOSTS]
        # the address moved before spark-3 was touched, and stayed with door-1 (nopreempt) once it was back
        floating = ipaddress.ip_interface(sim_fleet["lan"]["floating_address"])
        for line in ("front door address: keepalived stopped on spark-3", f"front door address: {floating} held by "
                     "door-1", "front door address: spark-3 drained", "front door address: keepalived back on spark-3"):
            assert line in err, (line, err[-3000:])
        assert holder(sim_fleet, DOORS) == "door-1"
        assert drivers(sim_fleet) == {h: NEW for h in HOSTS}
        [check] = report["speed_gate"]["checks"]  # the canary's release on the new driver against the old one's
        assert (check["host"], check["verdict"]) == (canary, "passed"), check
        assert boots() == {h: n + 1 for h, n in started.items()}
        assert probe.failures == [], f"{len(probe.failures)} of {len(probe.results)} failed: {probe.failures[:5]}"
        assert len(probe.results) >= 20, len(probe.results)
        through = [s.why for s in load.sent if not s.ok]
        print(f"through the floating address: {len(load.sent)} requests, {len(through)} failed")
        assert through == [] and len(load.sent) >= 20, (len(load.sent), through[:5])
        inventory, url = two_doors(tmp_path, sim_fleet)  # spark-3's state after its reboot (its published ports)

        again = sparkfleet("upgrade", inventory, "--json", timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        assert [h["result"] for h in json.loads(again.stdout)["hosts"]] == ["unchanged"] * 3
        assert boots() == {h: n + 1 for h, n in started.items()}
    finally:
        sim("reset-driver")
        # door-1 the one door again: the converge of its inventory (every host) takes spark-3's door away, its
        # keepalived and its users' keys with it, and door-1's keepalived and peers; puts back a hold too
        inventory, url = door_now(tmp_path)
        back = deploy(inventory)
    assert back.returncode == 0, back.stdout[-3000:] + back.stderr[-3000:]
    assert drivers(sim_fleet) == {h: "580.95.05" for h in HOSTS}
    wait_until(lambda: backend_states(inventory) == {h: "in" for h in HOSTS}, 60)
    assert ssh(sim_fleet, "spark-3", "systemctl is-active sparkfleet-front-door.service sparkfleet-door-address.service "
               "|| true").split() == ["inactive", "inactive"]
    assert ssh(sim_fleet, "spark-3", "ss -Hltn 'sport = :8080' | wc -l; ls /etc/sparkfleet/front-door | wc -l") \
        .split() == ["0", "0"]
