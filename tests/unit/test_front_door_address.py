"""Two or more front doors, one address (roles/front_door/address.py): the settings' refusals (each one line
naming the fix), keepalived's config (checked by the real keepalived where installed), HAProxy's peers section
(two real HAProxys on loopback share the usage table), the interface found from `ip -j -4 addr`, and the rule a
planned change follows (`handover`)."""

from __future__ import annotations

import json
import socket
import subprocess
import time

import pytest
import requests

from sparkfleet.contract import paths
from sparkfleet.contract.settings import SettingsError, parse_settings
from sparkfleet.roles.front_door import address as fd_address, plan as fd_plan
from sparkfleet.release.plan import plan_hosts

from tests.tiers import needs
from .helpers import KEY, Server, door_files, host_data, make_model, start_haproxy, wait_for
from .test_front_door import ALICE, BOB, NAME

FLOATING = "10.0.0.100/24"


def plans(doors=("door-1", "door-2"), sparks=("spark-1",), door_over=None, **common):
    """Offline plans: `sparks` serving with a LAN API, and `doors` (front_door service hosts) at 10.0.0.1x."""
    base = {"api_host": "0.0.0.0", "api_key": KEY, "front_door_users": {"alice": ALICE, "bob": BOB},
            "front_door_allow_http": True, "backend_key_in_clear": True, **common}
    hosts = [(name, host_data(**{**base, "lan_address": f"10.0.0.{n}"})) for n, name in enumerate(sparks, 1)]
    hosts += [(name, host_data(**{**base, "lan_address": f"10.0.0.{n}", "_sparkfleet_groups": ["front_door"],
                                  **(door_over or {}).get(name, {})}))
              for n, name in enumerate(doors, 11)]
    return {p.name: p for p in plan_hosts(hosts, resolve=False)}


def refused(names, found) -> str:
    with pytest.raises(SettingsError) as exc:
        fd_address.door_set(list(names), found)
    assert all("\n" not in line for line in exc.value.problems)
    return str(exc.value)


# --- the setting's type -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "says"), [
    ("10.0.0.100", "with its network's prefix"),
    (100, "valid string"),
    ("10.0.0.0/24", "network's own or its broadcast"),
    ("10.0.0.255/24", "network's own or its broadcast"),
    ("fd00::100/64", "IPv6 is not supported"),
    ("127.0.0.5/8", "a unicast LAN address"),
    ("224.0.0.18/24", "a unicast LAN address"),
    ("169.254.1.1/16", "a unicast LAN address"),
    ("10.0.0.100/32", "a unicast LAN address"),
    ("10.0.0.100/24\nx", "control character"),
    ("10.0.0.0100/24", "floating IPv4 address"),
])
def test_a_floating_address_that_is_none_is_refused_in_one_line(value, says):
    with pytest.raises(SettingsError) as exc:
        parse_settings("door-1", host_data(front_door_address=value))
    assert len(exc.value.problems) == 1 and "front_door_address" in str(exc.value) and says in str(exc.value)


@pytest.mark.parametrize(("key", "value"), [("front_door_address_preempt", "yes please"),
                                            ("front_door_vrrp_unicast", "maybe"),
                                            ("front_door_vrrp_router_id", 0), ("front_door_vrrp_router_id", 256),
                                            ("front_door_peers_port", 0), ("front_door_peers_port", 70000),
                                            ("front_door_peers_port", "10000; rm")])
def test_the_other_new_settings_are_typed(key, value):
    with pytest.raises(SettingsError) as exc:
        parse_settings("door-1", host_data(**{key: value}))
    assert key in str(exc.value) and len(exc.value.problems) == 1


# --- the doors as one set ------------------------------------------------------------------------------

def test_one_door_without_an_address_is_what_it_was():
    found = plans(doors=("door-1",))
    assert fd_address.door_set(["door-1"], found) is None
    door = fd_plan.front_door_plan("door-1", found, doors=None)
    config = door.config()
    assert "peers" not in config and "localpeer" not in config
    assert fd_address.handover(["door-1"], (), "door-1") == fd_address.Handover()


def test_two_doors_share_the_usage_table_and_the_address():
    found = plans(front_door_address=FLOATING)
    doors = fd_address.door_set(["door-1", "door-2"], found)
    assert doors.router_id == 100 and doors.priority("door-1") > doors.priority("door-2")
    config = fd_plan.front_door_plan("door-2", found, doors=doors).config()
    assert "    localpeer door-2\n" in config
    assert "peers sparkfleet_doors\n    peer door-1 10.0.0.11:10000\n    peer door-2 10.0.0.12:10000\n" in config
    assert "gpc0 peers sparkfleet_doors\n" in config


def test_two_doors_without_an_address_still_share_the_table():
    doors = fd_address.door_set(["door-1", "door-2"], plans())
    assert doors.address is None and doors.peers("door-1")["section"] == fd_address.PEERS_SECTION
    assert doors.sharing == () and fd_address.handover(["door-1"], doors.sharing, None) == fd_address.Handover()


def test_two_groups_claiming_one_address_are_refused():
    """Two door sets in one inventory (the doors disagree), a host outside the doors naming another address, and
    the address a host's own: each one line with the fix."""
    found = plans(door_over={"door-1": {"front_door_address": FLOATING},
                             "door-2": {"front_door_address": "10.0.0.101/24"}})
    assert "name different `front_door_address`es" in refused(["door-1", "door-2"], found)
    found = plans(doors=("door-1",), door_over={"door-1": {"front_door_address": FLOATING}})
    found["spark-1"] = found["spark-1"].__class__(**{**found["spark-1"].__dict__, "settings": found[
        "spark-1"].settings.model_copy(update={"front_door_address": "10.0.0.101/24"})})
    assert "hosts outside the group front_door claim" in refused(["door-1"], found)
    found = plans(front_door_address="10.0.0.12/24")
    assert "door-2: front_door_address 10.0.0.12/24 is this host's own address" in refused(["door-1", "door-2"], found)
    found = plans(front_door_address="10.0.0.1/24")
    assert "spark-1: front_door_address 10.0.0.1/24 is this host's own address" in refused(["door-1", "door-2"], found)


def test_an_address_outside_the_doors_subnet_is_refused_offline():
    text = refused(["door-1", "door-2"], plans(front_door_address="10.9.9.9/24"))
    assert "front_door_address 10.9.9.9/24 is outside the network of door-1's LAN address 10.0.0.11" in text
    assert "choose an address in the doors' subnet" in text


def test_the_router_id_comes_from_the_address_or_the_setting():
    assert "set `front_door_vrrp_router_id`" in refused(["door-1", "door-2"], plans(front_door_address="10.0.1.0/23"))
    doors = fd_address.door_set(["door-1", "door-2"], plans(front_door_address="10.0.1.0/23",
                                                            front_door_vrrp_router_id=7))
    assert doors.router_id == 7


def test_the_peers_port_may_not_be_another_port_of_the_door():
    for port in (8080, 9090, 9093):  # front_door_port, monitoring_port, alertmanager_port
        text = refused(["door-1", "door-2"], plans(front_door_address=FLOATING, front_door_peers_port=port))
        assert f"front_door_peers_port {port} is" in text and "pick another port" in text


def test_unicast_needs_ip_addresses():
    found = plans(front_door_address=FLOATING, front_door_vrrp_unicast=True,
                  door_over={"door-2": {"lan_address": "door-2.lan"}})
    text = refused(["door-1", "door-2"], found)
    assert "front_door_vrrp_unicast needs the doors' LAN addresses as IP addresses" in text


# --- on the host: the interface, keepalived's config ----------------------------------------------------

IP_J = json.dumps([
    {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
    {"ifname": "eth0", "addr_info": [{"family": "inet", "local": "10.0.0.11", "prefixlen": 24},
                                     {"family": "inet", "local": "10.0.0.100", "prefixlen": 24}]},
    {"ifname": "bad name; rm", "addr_info": [{"family": "inet", "local": "10.9.9.1", "prefixlen": 24}]},
    {"ifname": "eth1", "addr_info": [{"family": "inet", "local": "not an address", "prefixlen": 24}]},
])


def test_the_interface_is_the_one_whose_network_holds_the_address():
    assert fd_address.interface_for("door-1", FLOATING, IP_J) == "eth0"


@pytest.mark.parametrize("answer", [IP_J, "not json", "[]", json.dumps({"ifname": "eth0"})])
def test_an_address_outside_every_network_of_the_host_is_refused_in_one_line(answer):
    with pytest.raises(SettingsError) as exc:
        fd_address.interface_for("door-1", "10.9.9.9/24", answer)
    assert len(exc.value.problems) == 1 and "\n" not in exc.value.problems[0]
    if answer == IP_J:
        assert str(exc.value) == ("door-1: front_door_address 10.9.9.9/24 is outside every network of door-1 "
                                  "(127.0.0.0/8 on lo, 10.0.0.0/24 on eth0): choose an address in the doors' subnet")


@pytest.mark.parametrize(("preempt", "unicast"), [(False, False), (True, True)])
def test_keepalived_config(preempt, unicast):
    doors = fd_address.door_set(["door-1", "door-2"], plans(front_door_address=FLOATING,
                                                            front_door_address_preempt=preempt,
                                                            front_door_vrrp_unicast=unicast))
    conf = fd_address.keepalived_conf(doors, "door-2", "eth0", 8080, tls=True)
    assert "state BACKUP" in conf and "virtual_router_id 100" in conf and "priority 199" in conf
    assert ("nopreempt" in conf) is not preempt
    assert "10.0.0.100/24 dev eth0" in conf and "advert_int 1" in conf
    assert "https://127.0.0.1:8080/health" in conf and "interval 1" in conf and "fall 2" in conf
    assert ("unicast_peer {\n        10.0.0.11\n    }" in conf) is unicast
    # unicast: an advert from an address that is no door's is dropped, never yielded to (keepalived's
    # check_unicast_src, inside the instance); multicast has no peer list to check against
    instance = conf[conf.index("vrrp_instance"):]
    assert ("\n    check_unicast_src\n" in instance) is unicast
    with pytest.raises(ValueError):
        fd_address.keepalived_conf(doors, "door-2", "eth0 dev lo", 8080, tls=False)


@pytest.mark.keepalived
@pytest.mark.parametrize(("preempt", "unicast"), [(False, False), (True, True)])
def test_keepalived_takes_the_config(preempt, unicast, tmp_path):
    """keepalived's own check of the config (-t), which also wants its interface to exist: one of this machine's."""
    interfaces = sorted(name for _, name in socket.if_nameindex() if name != "lo")  # this network namespace's
    if not interfaces:
        pytest.skip("keepalived -t checks the config's interface exists, and this network namespace has only "
                    "loopback (an offline run: make unit-offline)")
    doors = fd_address.door_set(["door-1", "door-2"], plans(front_door_address=FLOATING,
                                                            front_door_address_preempt=preempt,
                                                            front_door_vrrp_unicast=unicast))
    (tmp_path / "k.conf").write_text(fd_address.keepalived_conf(doors, "door-2", interfaces[0], 8080, tls=True))
    # keepalived 2.2.7's -t exits 5 on a config error (and says which line); a good config prints nothing
    # (where it ends by SIGTERM here, in a container)
    check = subprocess.run(["keepalived", "-t", "-f", str(tmp_path / "k.conf"), "--log-console", "--dont-fork"],
                           capture_output=True, text=True, timeout=30)
    assert check.returncode in (0, -15) and not (check.stdout + check.stderr).strip(), check.stdout + check.stderr


def test_the_unit_runs_keepalived_in_the_foreground_on_its_config():
    unit = fd_address.keepalived_unit()
    assert f"--dont-fork --log-console --vrrp -f {paths.DOOR_ADDRESS_CONFIG}" in unit


# --- planned changes: the address first ----------------------------------------------------------------

def test_a_change_of_the_holding_door_hands_the_address_over_and_drains_it_first():
    doors = fd_address.door_set(["door-1", "door-2", "door-3"], plans(doors=("door-1", "door-2", "door-3"),
                                                                      front_door_address=FLOATING))
    step = fd_address.handover(["spark-1", "door-1"], doors.sharing, holder="door-1")
    assert step == fd_address.Handover(release=("door-1",), wait_for=("door-2", "door-3"), drain=("door-1",),
                                       rejoin=("door-1",))
    # a door that does not hold it: its keepalived off during the change (it must not take the address while its
    # HAProxy restarts), nothing to wait for
    step = fd_address.handover(["door-2"], doors.sharing, holder="door-1")
    assert step == fd_address.Handover(release=("door-2",), rejoin=("door-2",))
    assert fd_address.handover(["spark-1"], doors.sharing, holder="door-1") == fd_address.Handover()
    every = fd_address.handover(["door-1", "door-2", "door-3"], doors.sharing, holder="door-1")
    assert every.release == () and "put the doors in different batches" in every.problem


# --- two real HAProxys sharing the usage table ---------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ask(sock_path: str, command: str) -> str:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(sock_path)
        sock.sendall(command.encode() + b"\n")
        return b"".join(iter(lambda: sock.recv(65536), b"")).decode()


@needs("haproxy")
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_two_doors_share_the_per_user_rate_through_peers(tmp_path, tls):
    """Requests to one door: the other door's table shows the same rate (and holds the limit); where the hops are
    TLS, the peers link is too (each door's own peers certificate, the other's checked against the doors' list)."""
    import dataclasses
    from pathlib import Path

    from sparkfleet.roles import pki

    engine = Server(make_model(tmp_path / "model"), "--served-model-name", NAME, "--api-key", KEY,
                    SIM_TOKENS_PER_S="500", SIM_FIRST_TOKEN_DELAY_MS="5")
    found = plans(sparks=("spark-1",), front_door_address=None, front_door_peers_port=_free_port())
    names = ["door-1", "door-2"]
    ports = {n: _free_port() for n in names}
    peer_ports = {n: _free_port() for n in names}
    doors = fd_address.door_set(names, found)
    assert doors.peers_server_options is None  # plain hops (backend_key_in_clear): a plain peers link
    if tls:
        doors = dataclasses.replace(doors, peers_server_options=fd_address.PEERS_TLS)
        ca_cert, ca_key = pki.new_ca()
        (tmp_path / "ca.crt").write_bytes(ca_cert)
        (tmp_path / "ca.key").write_bytes(ca_key)
        (tmp_path / "ca.key").chmod(0o600)
        ca = pki.load_ca(tmp_path / "ca.crt", tmp_path / "ca.key")
    procs = []
    try:
        for n in names:
            d = fd_plan.front_door_plan(n, found, doors=doors)
            d = fd_plan.FrontDoor(d.host, d.settings.model_copy(update={"front_door_port": ports[n]}),
                                  (fd_plan.Backend("spark-1", "127.0.0.1", engine.port),), d.api_key, doors=doors)
            tmp = tmp_path / n
            tmp.mkdir()
            door_files(d, tmp)
            moved = {paths.FRONT_DOOR_DIR: str(tmp), paths.FRONT_DOOR_SOCKET: str(tmp / "admin.sock"),
                     paths.FRONT_DOOR_STATE_FILE: str(tmp / "state"), f"bind :{ports[n]}": f"bind 127.0.0.1:{ports[n]}",
                     paths.FRONT_DOOR_USAGE_SNAPSHOT: str(tmp / "usage.snapshot")}
            for m in names:  # each door's peer line on loopback, its own port
                moved[f"peer {m} 10.0.0.{11 + names.index(m)}:{doors.peers_port}"] = \
                    f"peer {m} 127.0.0.1:{peer_ports[m]}"
            config = d.config()
            if tls:
                assert all(f"default-{kind} {fd_address.PEERS_TLS}" in config for kind in ("bind", "server"))
                peers = pki.peers_state(ca, n, [(door.name, door.lan_address) for door in doors.doors])
                for path, f in peers.files.items():
                    (tmp / Path(path).name).write_text(f.content)
                    moved[path] = str(tmp / Path(path).name)
            procs.append(start_haproxy(config, tmp, moved))
        for n in names:
            wait_for(lambda n=n: requests.get(f"http://127.0.0.1:{ports[n]}/health").status_code == 200)
        for _ in range(3):
            answer = requests.post(f"http://127.0.0.1:{ports['door-1']}/v1/chat/completions",
                                   headers={"Authorization": f"Bearer {ALICE}"},
                                   json={"model": NAME, "messages": [{"role": "user", "content": "hi"}],
                                         "max_tokens": 2}, timeout=30)
            assert answer.status_code == 200

        def rate(n: str) -> str:
            table = _ask(str(tmp_path / n / "admin.sock"), "show table sparkfleet_usage")
            line = next((x for x in table.splitlines() if "key=alice" in x), "")
            return line.partition("http_req_rate(60000)=")[2].split(" ")[0]

        wait_for(lambda: rate("door-2") == "3", 10)
        assert rate("door-1") == "3"
    finally:
        for p in procs:
            p.terminate()
            p.wait()
        engine.stop()


def test_the_runtime_moves_the_address_before_the_change_and_back_after():
    """FrontDoorRuntime.hand_over on a batch holding the holder: keepalived stopped there, the other door seen
    holding the address, the old holder drained; `rejoin` starts keepalived again; in that order."""
    from sparkfleet.fleet.front_door import runtime as fd_runtime

    calls = []

    class Doors(fd_runtime.FrontDoorRuntime):
        held = "door-1"

        def _shell(self, command):
            names = [n for n, _ in self.doors]
            if command.startswith("systemctl stop"):
                calls.append(("stop", tuple(names)))
                Doors.held = "door-2"
            elif command.startswith("systemctl start"):
                calls.append(("start", tuple(names)))
            elif "show stat" in command:
                calls.append(("drained?", tuple(names)))
                return {n: "# pxname,svname,scur\napi,FRONTEND,0\n" for n in names}
            elif "ip -o -4 addr" in command:
                return {n: "@held\n" if n == Doors.held else "" for n in names}
            return {n: "" for n in names}

    data = host_data(front_door_address=FLOATING, drain_timeout_s=5)
    doors = Doors("inventory.py", [("door-1", data), ("door-2", data)])
    step = doors.hand_over(["door-1", "spark-1"], log=lambda line: None)
    doors.rejoin(step, log=lambda line: None)
    assert calls == [("stop", ("door-1",)), ("drained?", ("door-1",)), ("start", ("door-1",))]
    assert Doors("inventory.py", [("door-1", host_data())]).hand_over(["door-1"]) == fd_address.Handover()
