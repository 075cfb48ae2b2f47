"""Two front doors, one address (issue 37), on the simulated fleet: door-1 and door-2 (service hosts) in the group
front_door of inventory/sim_two_doors.py, keepalived moving the floating address (on the sim's LAN, which this
machine reaches over the Docker bridge) between them, HAProxy's peers sharing the users' limits. The module leaves
door-2 up and both doors converged, as `make demo` leaves them.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from sparkfleet.contract import paths
from tests.waiting import wait_until

from .conftest import HOSTS, ROOT, container, converge, ssh
from .paced import Paced

pytestmark = pytest.mark.e2e

MODEL = "Qwen3.5-35B-A3B"
DOORS = ("door-1", "door-2")
ALICE, CAROL = "alice-two-doors-0123456789", "carol-two-doors-0123456789"
USERS = {"alice": ALICE, "carol": {"key": CAROL, "requests_per_minute": 3}}


def write_inventory(tmp_path) -> str:
    """inventory/sim_two_doors.py with this module's users on both doors."""
    path = tmp_path / "two_doors.py"
    path.write_text(f"import runpy\n_two = runpy.run_path({str(ROOT / 'inventory/sim_two_doors.py')!r})\n"
                    "sparks, monitoring = _two['sparks'], _two['monitoring']\n"
                    f"front_door = [(n, {{**d, 'front_door_users': {USERS!r}}}) for n, d in _two['front_door']]\n")
    return str(path)


def holder(state: dict, doors: tuple[str, ...] = DOORS) -> str | None:
    """The door whose interface holds the floating address now (asked inside each door's container)."""
    ip = str(ipaddress.ip_interface(state["lan"]["floating_address"]).ip)
    for door in doors:
        shown = subprocess.run(["docker", "exec", container(door), "ip", "-o", "-4", "addr", "show"],
                               capture_output=True, text=True, check=False).stdout
        if f"inet {ip}/" in shown:
            return door
    return None


def door_url(door: str) -> str:
    """A door's own port 8080, published on 127.0.0.1 (not the floating address)."""
    out = subprocess.run(["docker", "port", container(door), "8080/tcp"], capture_output=True, text=True,
                         check=True).stdout
    return f"http://{out.split()[0]}"


def sparkfleet(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkfleet", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)


def usage_requests(inventory: str) -> dict[str, int]:
    proc = sparkfleet("usage", inventory, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {name: row["requests"] for name, row in json.loads(proc.stdout)["users"].items()}


def door_backends(state: dict) -> dict[str, dict[str, str]]:
    """{door: {backend: state}} as each door's HAProxy holds them (what a failure message should show)."""
    from sparkfleet.fleet.front_door.runtime import backend_states
    from sparkfleet.roles.front_door.records import runtime_command

    out = {}
    for door in DOORS:
        shown = ssh(state, door, runtime_command("show stat"), check=False)
        out[door] = {host: row["state"] for host, row in backend_states(shown).items()} if shown else {}
    return out


@pytest.fixture(scope="module")
def two_doors(sim_fleet, first_converge, tmp_path_factory):
    """door-2 beside door-1, the whole fleet converged with both doors and the floating address; its URL. After the
    module: door-2 gone and door-1 the single door of inventory/sim_front_door.py again (keepalived off), as the
    session's fleet was."""
    from sim import fleet

    state = fleet.up(hosts=len(HOSTS), service_hosts=len(DOORS))
    inventory = write_inventory(tmp_path_factory.mktemp("two_doors"))
    done = converge(inventory=inventory)
    assert done.returncode == 0, done.output[-4000:]
    vip = str(ipaddress.ip_interface(state["lan"]["floating_address"]).ip)
    url = f"http://{vip}:8080"
    import requests

    wait_until(lambda: requests.get(f"{url}/health", timeout=2).status_code == 200, 60, "the floating address answers",
               ignore=(requests.RequestException,))
    # both doors route to every backend before anything is asked of them (each checks the guards over TLS itself)
    wait_until(lambda: all(b == {h: "in" for h in HOSTS} for b in door_backends(state).values()), 60,
               "both doors have every backend in", explain=lambda: repr(door_backends(state)))
    yield state, inventory, url
    for door in DOORS:  # a test that failed half way may have left one off
        subprocess.run(["docker", "start", container(door)], capture_output=True, check=False)
    fleet.up(hosts=len(HOSTS), service_hosts=1)
    # the whole inventory: its guards speak plain http again (backend_key_in_clear), as its door will ask them
    try:  # the next module's fixtures converge what they need themselves: a failure here is reported, not raised
        back = converge(inventory=str(ROOT / "inventory/sim_front_door.py"))
        if back.returncode:
            print(f"two doors' teardown: the single-door converge failed:\n{back.output[-3000:]}")
    except AssertionError as exc:
        print(f"two doors' teardown: {exc}"[:3000])


@dataclass
class Sent:
    started: float
    ended: float
    ok: bool
    why: str = ""


class Load(Paced):
    """Non-streaming chats through the floating address with the official openai client at its default retries."""

    join_s = 60.0

    def __init__(self, url: str, key: str, rate: float = 5.0, timeout_s: float = 10.0):
        import openai

        super().__init__(rate)
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, timeout=timeout_s)  # default max_retries
        self.sent: list[Sent] = []

    def one(self, n: int, started: float) -> None:
        try:
            reply = self.client.chat.completions.create(
                model=MODEL, max_tokens=4, messages=[{"role": "user", "content": f"two doors {n}"}])
            ok, why = bool(reply.choices), ""
        except Exception as exc:  # noqa: BLE001  (any failure the client reports counts as one)
            ok, why = False, f"{type(exc).__name__}: {exc}"[:200]
        with self.lock:
            self.sent.append(Sent(started, time.monotonic(), ok, why))

    def served(self, since: float = 0.0) -> int:
        """How many requests started at `since` or later have been served so far."""
        with self.lock:
            return sum(1 for s in self.sent if s.ok and s.started >= since)

    def ended(self, since: float) -> int:
        """How many requests started at `since` or later have ended so far, served or not."""
        with self.lock:
            return sum(1 for s in self.sent if s.started >= since)


def test_the_holding_door_powered_off_the_other_serves_within_5_s_and_keeps_the_address(two_doors):
    state, inventory, url = two_doors
    first = wait_until(lambda: holder(state), 30, "a door holds the floating address")
    other = next(d for d in DOORS if d != first)
    # a user at their per-minute limit on one door is limited on the other (the peers share the table)
    import requests

    asked = [requests.post(f"{door_url(first)}/v1/chat/completions", timeout=30,
                           headers={"Authorization": f"Bearer {CAROL}"},
                           json={"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
             for _ in range(3)]
    assert [r.status_code for r in asked] == [200] * 3
    past = requests.post(f"{door_url(other)}/v1/chat/completions", timeout=30,
                         headers={"Authorization": f"Bearer {CAROL}"},
                         json={"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]})
    assert past.status_code == 429, (past.status_code, past.text[:300])
    before = usage_requests(inventory)

    try:
        with Load(url, ALICE) as load:
            # the load flows through the holder (10 served: 2 s at 5 a second) before the holder is lost
            wait_until(lambda: load.served() >= 10, 30, "10 requests served through the floating address")
            killed = time.monotonic()
            subprocess.run(["docker", "stop", "-t", "0", container(first)], check=True, capture_output=True)
            wait_until(lambda: holder(state) == other, 15, f"{other} holds the floating address")
            moved = time.monotonic() - killed
            # status still reads the fleet while a door is lost (the sim's inventory loads without its port), and
            # names the lost door and the holder
            shown = sparkfleet("status", inventory, "--json", timeout=120)
            assert shown.stdout.startswith("{"), shown.stderr[-2000:]
            door = json.loads(shown.stdout)["front_door"]
            assert door["holder"] == other, door
            assert {d["host"]: d["up"] for d in door["doors"]} == {first: False, other: True}, door
            # the window the last assertion judges: 60 requests sent from 5 s after the power-off on have ended
            # (12 s of load at 5 a second; the old fixed window, 15 s after the move, held about as many)
            wait_until(lambda: load.ended(killed + 5.0) >= 60, 90, "60 requests sent after the first 5 s ended",
                       explain=lambda: f"{load.ended(killed + 5.0)} ended, {load.served(killed + 5.0)} served")
        in_flight = [s for s in load.sent if s.started < killed < s.ended]
        failed = [s for s in load.sent if not s.ok]
        served_after = [s for s in load.sent if s.ok and s.started >= killed]
        assert served_after, (f"nothing sent after the power-off was served; {other}'s backends: "
                              f"{door_backends(state).get(other)}; failures: {[s.why for s in failed][:5]}")
        first_served_s = min(s.ended for s in served_after) - killed
        print(f"{len(load.sent)} requests: {len(failed)} failed, {len(in_flight)} in flight at the power-off; the "
              f"address moved in {moved:.1f} s; the first request sent after it was served {first_served_s:.1f} s "
              "after")
        assert first_served_s <= 5.0, first_served_s
        assert len(failed) <= len(in_flight), [s.why for s in failed]
        assert all(s.ok for s in load.sent if s.started >= killed + 5.0), [s.why for s in failed]
    finally:  # the door back (whatever failed: the next tests want both)
        restarted = int(time.time())  # the containers share this machine's clock
        subprocess.run(["docker", "start", container(first)], check=True, capture_output=True)
    # it rejoins as a backup (keepalived's own word that its VRRP instance runs) ...
    wait_until(lambda: "Entering BACKUP STATE" in ssh(
        state, first, f"journalctl -u sparkfleet-door-address.service --since @{restarted - 1} --no-pager -o cat",
        check=False), 120, f"keepalived back on {first} as a backup")
    # ... and takes nothing back from the healthy holder (nopreempt): the holder's adverts reach it every second
    # (advert_int 1) and a preempting door takes the address at the first; the holder checked at each of five
    for _ in range(5):
        time.sleep(1)
        assert holder(state) == other
    # what the doors counted survives the loss of one: usage per user never runs backwards
    after = usage_requests(inventory)
    assert all(after.get(name, 0) >= count for name, count in before.items()), (before, after)


def test_a_door_restarted_mid_run_keeps_every_users_usage(two_doors):
    state, inventory, url = two_doors
    import requests

    for n in range(3):
        reply = requests.post(f"{url}/v1/chat/completions", timeout=30, headers={"Authorization": f"Bearer {ALICE}"},
                              json={"model": MODEL, "max_tokens": 1,
                                    "messages": [{"role": "user", "content": f"usage {n}"}]})
        assert reply.status_code == 200
    # each door's usage snapshot written by its timer (every 5 s) after these requests: what is reported is what is
    # on disk, these three included
    sent = int(time.time())  # the containers share this machine's clock; a file's mtime is in whole seconds
    snapshot = f"stat -c %Y {paths.FRONT_DOOR_USAGE_SNAPSHOT}"
    wait_until(lambda: all(int(ssh(state, d, snapshot, check=False) or 0) > sent for d in DOORS), 30,
               "each door's usage snapshot written after the requests")
    before = usage_requests(inventory)
    door = wait_until(lambda: holder(state), 30, "a door holds the floating address")
    ssh(state, door, "systemctl restart sparkfleet-front-door.service")
    wait_until(lambda: requests.get(f"{url}/health", timeout=2).status_code == 200, 60, "the door answers again",
               ignore=(requests.RequestException,))
    after = usage_requests(inventory)
    assert all(after.get(name, 0) >= count for name, count in before.items()), (before, after)
    assert after["alice"] >= 3


def test_no_backend_key_crosses_the_lan_in_clear_and_a_guard_wants_the_fleets_certificate(two_doors, tmp_path):
    """tcpdump on the sim's LAN (its Docker bridge) through a converge, a status, Prometheus's scrapes and chats
    through the doors: the backend key on no backend hop, no plain-HTTP request to a guard; and a guard refuses, at
    the handshake, a LAN host with no fleet certificate."""
    state, inventory, url = two_doors
    import requests

    network = subprocess.run(["docker", "network", "inspect", "-f", "{{.Id}}", state["lan"]["network"]],
                             capture_output=True, text=True, check=True).stdout.strip()
    pcap = tmp_path / "lan.pcap"
    capture = subprocess.Popen(["tcpdump", "-i", f"br-{network[:12]}", "-s", "0", "-U", "-w", str(pcap), "tcp"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: pcap.exists(), 10, "tcpdump writes its capture")
        started = time.monotonic()
        done = converge(inventory=inventory)
        assert done.returncode == 0, done.output[-3000:]
        status = sparkfleet("status", inventory, "--json")
        assert status.returncode == 0, status.stdout[-2000:] + status.stderr[-2000:]
        for n in range(3):
            reply = requests.post(f"{url}/v1/chat/completions", timeout=30,
                                  headers={"Authorization": f"Bearer {ALICE}"}, json={"model": MODEL, "max_tokens": 4,
                                        "messages": [{"role": "user", "content": f"capture {n}"}]})
            assert reply.status_code == 200
        # Prometheus (door-1) scrapes each guard every scrape interval: at least two rounds in the capture
        time.sleep(max(0.0, started + 35 - time.monotonic()))
    finally:
        capture.terminate()
        capture.wait(10)
    # the guards' port (8000 on each Spark): what reached it, as text
    to_guards = subprocess.run(["tcpdump", "-r", str(pcap), "-A", "-nn",
                                "tcp dst port 8000 and tcp[tcpflags] & tcp-push != 0"],
                               capture_output=True, text=True, check=True).stdout
    assert to_guards, "no traffic to a guard was captured"
    for plain in ("HTTP/1.1", "Authorization", "authorization"):
        assert plain not in to_guards, f"{plain!r} sent to a guard in clear"
    # inventory/sim.py's api_key, the backend key: on no backend hop (everything but the doors' own port 8080, which
    # the sim serves in plain http on purpose, `front_door_allow_http`: an office's door has its TLS certificate)
    backend_hops = tmp_path / "backend-hops.pcap"
    subprocess.run(["tcpdump", "-r", str(pcap), "-w", str(backend_hops), "not tcp port 8080"], capture_output=True,
                   check=True)
    assert b"sim-key" not in backend_hops.read_bytes()
    # a LAN host without the fleet's client certificate: refused in the handshake (curl: 35/56), plain http too
    guard = f"{container('spark-1')}:8000/health"
    shown = ssh(state, "door-2", f"curl -sk -o /dev/null -w '%{{http_code}}' https://{guard}; echo \" $?\"; "
                                 f"curl -s -o /dev/null -m 5 http://{guard}; echo $?", check=False).split()
    assert shown[0] == "000" and shown[1] in ("35", "56") and shown[2] != "0", shown
