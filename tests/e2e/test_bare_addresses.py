"""An inventory written the plain pyinfra way (issue 36, item 9): the demo fleet re-listed by each host's address
on the simulated network alone (`sparks = ["172.x.y.z", ...]`, no ssh_hostname, no controller_*_url, no
lan_address; the settings in group_data beside it). The controller reaches each host where pyinfra does, its
inventory name: `sparkfleet status` asks every engine at http://ADDRESS:8000 and finds the fleet healthy (exit 0),
and the front door's URL is http://ADDRESS:8080, where a user's chat is answered.

Read-only: the shared converged fleet and its front door (`door`, as test_front_door.py's tests find it); no
converge of this inventory. Only the controller's URLs and SSH lines change with the naming.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from . import test_front_door
from .conftest import HOSTS, ROOT
from .test_front_door import DOOR, USERS, chat, sparkfleet

pytestmark = pytest.mark.e2e
door = test_front_door.door  # the fleet converged with its front door on door-1 (every backend in)

API_PORT, DOOR_PORT = 8000, 8080  # group_data/all.py's api_port, front_door_port: what the sim publishes
PER_HOST = ("ssh_hostname", "ssh_port", "lan_address", "fabric_address", "controller_api_url",
            "controller_front_door_url", "ssh_known_hosts_file")  # the sim's 127.0.0.1 detour, and per-host data


def lan_address(container: str, network: str) -> str:
    """A container's address on the sim's LAN network (the controller, Docker's host, reaches it directly)."""
    out = subprocess.run(["docker", "inspect", "-f", "{{json .NetworkSettings.Networks}}", container],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)[network]["IPAddress"]


def known_hosts_by_address(sim_known_hosts: str, rows: list[dict], at: dict[str, str], path: Path) -> str:
    """The sim's known_hosts ("[127.0.0.1]:PORT TYPE KEY") re-keyed by each host's LAN address (port 22):
    strict host-key checking still holds."""
    by_port = {f"[127.0.0.1]:{row['ssh_port']}": at[row["name"]] for row in rows if row["name"] in at}
    lines = [line.split(None, 1) for line in Path(sim_known_hosts).read_text().splitlines() if line.strip()]
    path.write_text("".join(f"{by_port[host]} {rest}\n" for host, rest in lines if host in by_port))
    return str(path)


def bare_inventory(tmp_path: Path, at: dict[str, str], sim_state: dict) -> str:
    """inventory.py (bare addresses) and group_data/{sparks,front_door}.py beside it: the sim's settings less
    anything that says where a host is."""
    import runpy

    common = runpy.run_path(str(ROOT / "inventory/sim.py"))["_common"]
    rows = [*sim_state["hosts"], *sim_state.get("service_hosts", [])]
    known = known_hosts_by_address(common["ssh_known_hosts_file"], rows, at, tmp_path / "known_hosts")
    shared = {**{k: v for k, v in common.items() if k not in PER_HOST}, "ssh_known_hosts_file": known}
    door_settings = {"front_door_users": USERS, "drain_timeout_s": 30, "front_door_allow_http": True}
    (tmp_path / "group_data").mkdir(exist_ok=True)
    for group, data in (("sparks", shared), ("front_door", {**shared, **door_settings})):
        (tmp_path / "group_data" / f"{group}.py").write_text("".join(f"{k} = {v!r}\n" for k, v in data.items()))
    inventory = tmp_path / "bare.py"
    inventory.write_text(f"sparks = {[at[h] for h in HOSTS]!r}\nfront_door = {[at[DOOR]]!r}\n")
    return str(inventory)


def test_an_inventory_of_bare_addresses_gets_a_healthy_status_and_a_chat_through_the_front_door(door, sim_fleet,
                                                                                                tmp_path):
    network = sim_fleet["services"]["network"]
    containers = {row["name"]: row["container"] for row in [*sim_fleet["hosts"], *sim_fleet["service_hosts"]]}
    at = {name: lan_address(containers[name], network) for name in (*HOSTS, DOOR)}
    inventory = bare_inventory(tmp_path, at, sim_fleet)
    assert "ssh_hostname" not in Path(inventory).read_text() + (tmp_path / "group_data" / "sparks.py").read_text()

    done = sparkfleet("status", inventory, "--json", timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert {row["host"]: (row["url"], row["healthy"]) for row in report["hosts"]} == \
        {at[h]: (f"http://{at[h]}:{API_PORT}", True) for h in HOSTS}, report["hosts"]
    door_url = f"http://{at[DOOR]}:{DOOR_PORT}"
    assert (report["front_door"]["url"], report["front_door"]["up"]) == (door_url, True), report["front_door"]

    code, body, _ = chat(door_url, USERS["alice"], [{"role": "user", "content": "hello from a bare address"}], False)
    assert code == 200, body[:500]
