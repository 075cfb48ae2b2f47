"""Nothing on the LAN but the guards and the front door: from another simulated host, spark-1's API port
answers nothing but /health without the backend key (and nothing but its own paths with it), its engine's
port refuses the connection; through the front door (on door-1, a service host) a user key reaches exactly the
allow-listed paths, and door-1 listens on nothing else but sshd."""

from __future__ import annotations

import subprocess

import pytest

from .conftest import ENGINE_PATHS, ROOT, container, lan_statuses, ssh

pytestmark = pytest.mark.e2e

HOST, OTHER = "spark-1", "spark-2"
LAN = f"http://{container(HOST)}"  # spark-1's address on the sim's network, as spark-2 reaches it
DOOR = "door-1"  # inventory/sim_front_door.py's front door, a service host
DOOR_LAN = f"http://{container(DOOR)}"
BACKEND_KEY = "sim-key"  # inventory/sim.py's api_key
USER_KEY = "demo-user-key-0123456789"  # inventory/sim_front_door.py's user demo
CHAT_SERVED = ("/v1/models", "/v1/chat/completions", "/metrics")


def test_the_lan_reaches_the_engine_only_through_its_guard(converged_fleet):
    state = converged_fleet
    for key in (None, USER_KEY, BACKEND_KEY + "x"):
        refused = lan_statuses(state, OTHER, f"{LAN}:8000", key=key)
        assert refused == {p: "200" if p == "/health" else "401" for p in ENGINE_PATHS}, (key and key[:4], refused)
    keyed = lan_statuses(state, OTHER, f"{LAN}:8000", key=BACKEND_KEY)
    # /v1/completions is passed on: the stand-in engine itself has no such route (vLLM has)
    assert {p: s for p, s in keyed.items() if p != "/v1/completions"} == {
        p: "200" if p in ("/health", *CHAT_SERVED) else "404" for p in ENGINE_PATHS if p != "/v1/completions"}
    engine = lan_statuses(state, OTHER, f"{LAN}:18000", ("/health", "/metrics"), key=BACKEND_KEY)
    assert engine == {"/health": "000", "/metrics": "000"}  # loopback only: the connection is refused
    log = ssh(state, HOST, "journalctl -u sparkfleet-guard.service -n 200 --no-pager -o cat")
    assert "user=backend GET /metrics" in log and BACKEND_KEY not in log


def test_through_the_front_door_a_user_key_reaches_exactly_the_allow_list(converged_fleet):
    state = converged_fleet
    inventory = str(ROOT / "inventory/sim_front_door.py")
    done = subprocess.run([str(ROOT / ".venv/bin/pyinfra"), "-y", inventory, "deploy.py", "--limit", "front_door"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    door = f"{DOOR_LAN}:8080"
    assert lan_statuses(state, OTHER, door) == {p: "200" if p == "/health" else "401" for p in ENGINE_PATHS}
    assert lan_statuses(state, OTHER, door, key=BACKEND_KEY) == {
        p: "200" if p == "/health" else "401" for p in ENGINE_PATHS}  # the engines' key opens no door
    reached = lan_statuses(state, OTHER, door, key=USER_KEY)
    assert {p: s for p, s in reached.items() if p != "/v1/completions"} == {
        p: "200" if p in ("/health", "/v1/models", "/v1/chat/completions") else "404"
        for p in ENGINE_PATHS if p != "/v1/completions"}
    assert reached["/v1/completions"] != "401"  # allow-listed: passed to the engines (the stand-in lacks it)
    log = ssh(state, DOOR, "journalctl -u sparkfleet-front-door.service -n 200 --no-pager -o cat")
    assert "user=demo POST /v1/chat/completions" in log and USER_KEY not in log
    listening = ssh(state, DOOR, "ss -Htln | awk '{print $4}'").split()
    beyond_loopback = {a.rsplit(":", 1)[1] for a in listening if not a.startswith(("127.", "[::1]"))}
    assert beyond_loopback == {"22", "8080"}, listening  # sshd and the front door: what the inventory asked for
