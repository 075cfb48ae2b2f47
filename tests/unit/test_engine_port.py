"""The API key goes only to the engine: who holds the port is read from /proc before a key is sent.

A process that listens on the API port before the engine binds (vLLM binds only after loading, and is
unbound after each crash) must never receive the key, and the watchdog must not count it as serving.
Real sockets on loopback for the hostile cases; a fixture /proc tree for the engine's own (cgroup v1 and v2).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socketserver
import struct
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sparkfleet.contract.shared import docker, sockets
from sparkfleet.contract.serving import serving_file
from sparkfleet.contract.settings import parse_settings
from tests.unit.helpers import Recorder, host_data
from tests.unit.test_watchdog import CFG, quick, wd

ROOT = Path(__file__).resolve().parents[2]
ENGINE_ID = "5881c751c0dcff039460d238f78369c61abcfdb7bc1147a17f8020955492571e"
OTHER_ID = "0" * 63 + "1"
KEY = "sk-squat-test-key"
V1 = "\n".join(f"{n}:{c}:/docker/{ENGINE_ID}" for n, c in ((12, "pids"), (4, "memory"), (1, "name=systemd"))) + "\n"
V2 = f"0::/system.slice/docker-{ENGINE_ID}.scope\n"


def proc_hex(address: str) -> str:
    """An address as the kernel prints it in /proc/net/tcp{,6}: 32-bit words in host byte order."""
    packed = ipaddress.ip_address(address).packed
    return "".join(f"{w:08X}" for w in struct.unpack(f"={len(packed) // 4}I", packed))


class FakeProc:
    """A /proc tree: net/tcp{,6} listeners and processes with fds, a cgroup file and a cmdline."""

    def __init__(self, root: Path):
        self.root, self.rows = root, {"tcp": [], "tcp6": []}
        (root / "net").mkdir(parents=True)

    def listen(self, address: str, port: int, inode: int, uid: int = 0, state: str = "0A"):
        table, local = "tcp6" if ":" in address else "tcp", proc_hex(address)
        self.rows[table].append(f"{len(self.rows[table])}: {local}:{port:04X} {'0' * len(local)}:0000 {state} "
                                f"00000000:00000000 00:00000000 00000000 {uid:5d} 0 {inode} 1 0 100 0 0 10 0")
        for name, rows in self.rows.items():
            (self.root / "net" / name).write_text("  sl  local_address rem_address   st ...\n" + "\n".join(rows) + "\n")

    def process(self, pid: int, cgroup: str, inodes=(), cmdline=("python3", "-m", "vllm")):
        base = self.root / str(pid)
        (base / "fd").mkdir(parents=True)
        (base / "cgroup").write_text(cgroup)
        (base / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmdline) + b"\0")
        for fd, inode in enumerate([*inodes, None], start=3):
            os.symlink(f"socket:[{inode}]" if inode else "/dev/null", base / "fd" / str(fd))


@pytest.fixture
def fake(tmp_path):
    proc = FakeProc(tmp_path / "proc")
    proc.listen("127.0.0.1", 22, 500)  # another port: never looked at
    proc.process(1, "0::/init.scope\n", [500], cmdline=("sshd",))
    return proc


@pytest.mark.parametrize("cgroup", [V1, V2], ids=["cgroup-v1", "cgroup-v2"])
@pytest.mark.parametrize("address", ["127.0.0.1", "0.0.0.0", "::", "::ffff:127.0.0.1"])
def test_the_engine_containers_listener_passes(fake, cgroup, address):
    fake.listen(address, 18000, 4242)
    fake.process(700, cgroup, [4242])
    fake.process(701, cgroup, [4242])  # a forked worker holding the same socket
    assert sockets.engine_listener(18000, ENGINE_ID, proc=fake.root) == (True, "")


def test_a_listener_elsewhere_or_not_listening_is_not_the_engine(fake):
    fake.listen("127.0.0.2", 18000, 10)  # a connection to 127.0.0.1 never reaches it
    fake.listen("127.0.0.1", 18000, 11, state="01")  # an established connection, not a listener
    fake.process(700, V2, [10, 11])
    assert sockets.engine_listener(18000, ENGINE_ID, proc=fake.root) == (False, "nothing listens on 127.0.0.1:18000")


@pytest.mark.parametrize(("holders", "why"), [
    ({800: f"0::/system.slice/docker-{OTHER_ID}.scope\n"}, "port 18000 is held by process 800 (python3) outside"),
    ({800: "0::/user.slice/user-1000.slice/session-3.scope\n"}, "port 18000 is held by process 800 (python3) outside"),
    ({700: V2, 800: "0::/user.slice\n"}, "process 800"),  # the engine's socket, also held by a stranger
    ({800: f"0::/user.slice/docker-{ENGINE_ID}x.scope\n"}, "process 800"),  # only a look-alike of the id
    ({}, "no process this helper can see holds the listener on port 18000 (socket 4242)"),
])
def test_a_foreign_or_unknown_holder_is_not_the_engine(fake, holders, why):
    fake.listen("127.0.0.1", 18000, 4242)
    for pid, cgroup in holders.items():
        fake.process(pid, cgroup, [4242])
    ok, reason = sockets.engine_listener(18000, ENGINE_ID, proc=fake.root)
    assert not ok and why in reason


def test_a_second_listener_on_the_port_is_not_the_engine(fake):
    """SO_REUSEPORT, or a wildcard and a loopback socket: every listener a connection could reach counts."""
    fake.listen("127.0.0.1", 18000, 4242)
    fake.listen("::", 18000, 4343, uid=1000)
    fake.process(700, V1, [4242])
    fake.process(900, "0::/user.slice\n", [4343], cmdline=("/usr/bin/nc", "-l"))
    assert sockets.engine_listener(18000, ENGINE_ID, proc=fake.root) == (
        False, "port 18000 is held by process 900 (nc) outside the engine container")


@pytest.mark.parametrize(("uid", "cmdline", "ips", "ok"), [
    (0, ("/usr/bin/docker-proxy", "-proto", "tcp", "-host-ip", "0.0.0.0", "-host-port", "18000",
         "-container-ip", "172.18.0.5", "-container-port", "18000"), ("172.18.0.5",), True),
    (0, ("/usr/bin/docker-proxy", "-container-ip", "172.18.0.9"), ("172.18.0.5",), False),  # another container's
    (1000, ("docker-proxy", "-container-ip", "172.18.0.5"), ("172.18.0.5",), False),  # a user naming itself so
    (0, ("/usr/bin/docker-proxy", "-container-ip", "172.18.0.5"), (), False),  # a host-network engine has no proxy
])
def test_a_published_port_passes_only_through_docker_proxy_to_the_engine(fake, uid, cmdline, ips, ok):
    fake.listen("0.0.0.0", 18000, 4242, uid=uid)
    fake.process(600, "0::/system.slice/docker.service\n", [4242], cmdline=cmdline)
    assert sockets.engine_listener(18000, ENGINE_ID, ips, proc=fake.root)[0] is ok


@pytest.mark.parametrize("container_id", ["", "vllm", ENGINE_ID[:12], ENGINE_ID.upper(), ENGINE_ID + "\n", None])
def test_the_container_id_is_64_hex_digits(fake, container_id):
    fake.listen("127.0.0.1", 18000, 4242)
    fake.process(700, V2, [4242])
    ok, why = sockets.engine_listener(18000, container_id, proc=fake.root)
    assert not ok and "is not 64 hex digits" in why


def test_an_unreadable_proc_fails_closed(tmp_path):
    ok, why = sockets.engine_listener(18000, ENGINE_ID, proc=tmp_path / "no-proc")
    assert not ok and why.startswith("cannot read the listeners of port 18000")


class Squatter(Recorder):
    """A process outside any container that took the port first: answers /health 200 and records every request."""

    def __init__(self):
        super().__init__({"object": "list", "data": [{"id": "sim-qwen", "object": "model"}]})

    def keys_seen(self):
        return [(m, p) for m, p, headers, body in self.seen
                if any(k.lower() == "authorization" for k in headers) or KEY.encode() in body]


@pytest.fixture
def squatter():
    s = Squatter()
    yield s
    s.close()


class FakeDockerd(BaseHTTPRequestHandler):
    """Docker's API on a unix socket, answering GET /containers/NAME/json from `containers` (the real engine is
    not here); what the helpers ask is recorded in `asked`."""

    containers: dict = {}
    asked: list = []

    def do_GET(self):
        self.asked.append(self.path)
        name = self.path.removeprefix("/containers/").removesuffix("/json")
        body, status = (json.dumps(self.containers[name]), 200) if name in self.containers else \
            (json.dumps({"message": f"No such container: {name}"}), 404)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_docker(monkeypatch):
    """DOCKER_HOST names a loopback dockerd that knows one running host-network container, `vllm`."""
    folder = tempfile.mkdtemp(prefix="dockerd-", dir="/tmp")  # a unix socket's path is at most 107 bytes
    handler = type("Dockerd", (FakeDockerd,), {"asked": [], "containers": {"vllm": {
        "Id": ENGINE_ID, "State": {"Running": True}, "HostConfig": {"NetworkMode": "host"},
        "NetworkSettings": {"Networks": {"host": {"IPAddress": ""}}}}}})
    server = socketserver.ThreadingUnixStreamServer(f"{folder}/docker.sock", handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{folder}/docker.sock")
    yield handler
    server.shutdown()
    server.server_close()
    shutil.rmtree(folder)


def test_the_real_proc_names_a_squatter_outside_the_container(squatter):
    ok, why = sockets.engine_listener(squatter.port, ENGINE_ID)
    assert not ok
    assert why == f"port {squatter.port} is held by process {os.getpid()} ({Path(sys.executable).name}) " \
                  "outside the engine container" or why.startswith("no process this helper can see")


def test_the_health_gate_never_sends_the_key_to_a_squatter(squatter, fake_docker, tmp_path):
    env_file = tmp_path / "engine.env"
    env_file.write_text(f"VLLM_API_KEY={KEY}\n")
    (tmp_path / "serving.json").write_text(serving_file(parse_settings("spark-1", host_data())))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "files" / "sparkfleet-health"), "--serving", str(tmp_path / "serving.json"),
         "--port", str(squatter.port),
         "--served-name", "sim-qwen", "--timeout", "5", "--env-file", str(env_file), "--container", "vllm"],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert f"health: the API key is not sent to 127.0.0.1:{squatter.port}: port {squatter.port} is held by " \
           "process" in proc.stderr and "outside engine container vllm" in proc.stderr, proc.stderr
    assert [(m, p) for m, p, *_ in squatter.seen] == [("GET", "/health")]  # asked, without a key
    assert squatter.keys_seen() == [] and KEY not in proc.stdout + proc.stderr


def test_the_watchdog_counts_a_squatter_as_a_failed_probe(squatter, fake_docker, tmp_path, monkeypatch):
    env_file = tmp_path / "engine.env"
    env_file.write_text(f"VLLM_API_KEY={KEY}\n")
    monkeypatch.setattr(wd, "gpu_check", lambda container: (True, "GPU 0: stand-in"))
    result = wd.probe({**quick(CFG, 2), "port": squatter.port, "served_name": "sim-qwen", "env_file": str(env_file),
                       "container": "vllm"})
    assert (result["serving"], result["failed"]) == (False, "owner")
    assert result["detail"].startswith(f"the key is not sent: port {squatter.port} is held by process ")
    assert squatter.keys_seen() == [] and KEY not in json.dumps(result)


def test_a_container_that_is_not_running_gets_no_key(squatter, fake_docker):
    fake_docker.containers = {"stopped": {"Id": ENGINE_ID, "State": {"Running": False}}}
    assert sockets.engine_holds_port("vllm", squatter.port) == (False, "container vllm is not running")  # 404
    assert sockets.engine_holds_port("stopped", squatter.port) == (False, "container stopped is not running")
    assert sockets.engine_holds_port("", squatter.port) == (False, "no engine container named")
    assert fake_docker.asked == ["/containers/vllm/json", "/containers/stopped/json"]


def test_docker_is_asked_over_its_socket_with_the_name_quoted(fake_docker):
    """The name is one path segment however it is spelled; a dockerd that is not there is a container not running."""
    assert docker.container_identity("vllm") == (ENGINE_ID, ())
    assert docker.container_identity("../../info?x=1") == ("", ())
    assert fake_docker.asked == ["/containers/vllm/json", "/containers/..%2F..%2Finfo%3Fx%3D1/json"]
    fake_docker.containers = {"bridged": {"Id": OTHER_ID, "State": {"Running": True}, "HostConfig": {},
                                          "NetworkSettings": {"Networks": {"bridge": {"IPAddress": "172.17.0.5"}}}},
                              "odd": ["not", "an", "object"]}
    assert docker.container_identity("bridged") == (OTHER_ID, ("172.17.0.5",))
    assert docker.container_identity("odd") == ("", ())
    os.environ["DOCKER_HOST"] = "unix:///nonexistent/docker.sock"
    assert docker.container_identity("vllm") == ("", ())


def test_an_impostor_on_the_port_does_not_end_the_engines_start():
    """decide() stays pure: a squatter answering /health is no sign that the engine loaded."""
    unit = {"active": "active", "sub": "running", "started": 7, "up_s": 60.0, "systemd_restarts": 0}
    owner = {"serving": False, "failed": "owner", "detail": "the key is not sent: ...", "gpu_visible": True}
    action, state = wd.decide(CFG, {}, unit, owner, 1000.0)
    assert action == "starting" and "answered_start" not in state
    action, state = wd.decide(CFG, {"answered_start": 7}, unit, owner, 1000.0)
    assert action == "failing" and state["consecutive_failures"] == 1
