"""What several unit test files share: host data as pyinfra merges it, the stand-in vLLM server,
and the default model's config.json."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import runpy
import signal
import struct
import subprocess
import sys
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import openai
import requests

from sparkfleet.contract.recipes import known_model
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "sim" / "engine" / "standin_vllm.py"
FLAGS = ROOT / "sparkfleet" / "release" / "engines" / "vllm-0.33.0.json"
KEY = "s3cret"  # the stand-in's API key where a test sets one
DEFAULTS = {k: v for k, v in runpy.run_path(str(ROOT / "group_data/all.py")).items() if not k.startswith("_")}


def free_api_port() -> int:
    """A free loopback port whose engine port (paths.engine_port: +10000) is free too: a guard's pair."""
    from sparkfleet.contract import paths

    while True:
        port = free_port()
        if port <= paths.MAX_API_PORT:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", paths.engine_port(port)))
                    return port
                except OSError:
                    continue


def no_keyscan(tmp_path: Path, monkeypatch) -> Path:
    """`sparkfleet init` in tmp/ with no Spark answering its key scan (a stand-in ssh-keyscan that fails on PATH) and
    HOME under tmp/ (its keys' default place): the home."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh-keyscan").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "ssh-keyscan").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def host_data(**overrides):
    return {**DEFAULTS, "ssh_hostname": "10.0.0.9", "ssh_user": "root", **overrides}


FETCH = ROOT / "files" / "sparkfleet-fetch"
SHARE = ROOT / "files" / "sparkfleet-share"


def run_fetch(job_path, *extra):
    """files/sparkfleet-fetch as a host runs it: (exit code, its JSON report or its stderr)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HOME": str(job_path.parent / "hf"),
           "MODELSCOPE_CACHE": str(job_path.parent / "ms")}
    proc = subprocess.run([sys.executable, str(FETCH), str(job_path), "--env-file", "/nonexistent", *extra],
                          capture_output=True, text=True, env=env, timeout=120)
    return proc.returncode, (json.loads(proc.stdout.splitlines()[-1]) if proc.returncode == 0 else proc.stderr)


def start_share(root, token_file, *extra):
    """files/sparkfleet-share on 127.0.0.1 (a free port): (the process, its base URL), once it answers."""
    import subprocess
    import sys
    import time
    import urllib.error
    import urllib.request

    from tests.conftest import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SHARE), "--root", str(root), "--bind", "127.0.0.1",
                             "--port", str(port), "--token-file", str(token_file), *extra])
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(f"{url}/", timeout=2)
        except urllib.error.HTTPError:
            return proc, url  # it answers (401: no token)
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"sparkfleet-share did not answer on {url}")


def qwen35_config() -> dict:
    """Qwen3.5-35B-A3B-FP8's config.json (the known copy sparkfleet falls back on): the text
    model nested under text_config. 40 layers = 30 Gated DeltaNet + 10 full attention (every
    4th), 16 heads, 2 KV heads, head_dim 256, hidden 2048, 256 experts of 512 (8 active + 1
    shared of 512), vocab 248,320, max_position_embeddings 262,144.
    """
    config = copy.deepcopy(known_model("Qwen/Qwen3.5-35B-A3B-FP8").config)
    config["vision_config"] = {"model_type": "qwen3_5_moe", "depth": 27, "hidden_size": 1152}
    return config


# ---- the stand-in vLLM server (sim/engine/standin_vllm.py), run as a process ----------------

def _write_shard(path: Path, tensors: dict[str, int]) -> None:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, n in tensors.items():
        header[name] = {"dtype": "BF16", "shape": [n], "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\x00" * offset)


def make_model(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "text_config": {"model_type": "qwen3_5_moe_text", "max_position_embeddings": 8192}}))
    shards = {"model-00001-of-00002.safetensors": {"embed.weight": 64, "layer.0.w": 32},
              "model-00002-of-00002.safetensors": {"lm_head.weight": 48}}
    weight_map = {}
    for fname, tensors in shards.items():
        _write_shard(root / fname, tensors)
        weight_map.update({t: fname for t in tensors})
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 288}, "weight_map": weight_map}))
    return root


def env(**extra) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SIM_", "VLLM_"))}
    # a stand-in before a test's front door stands for its host's guard: it answers the door's check too
    e.update({"SIM_LOAD_DELAY_S": "0", "PYTHONUNBUFFERED": "1", "SIM_GUARD_READY": "1"}, **extra)
    return e


def run_to_exit(*args, timeout=15, **env_extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(STANDIN), "--flags-file", str(FLAGS), *args],
                          capture_output=True, text=True, timeout=timeout, env=env(**env_extra))


class Recorder:
    """An HTTP server on loopback (`port`: 0 for a free one) that answers every GET and POST 200 (after the
    `statuses` given, one a request: an engine still loading) with `body` as JSON and records each request as
    (method, path, headers, body): a stand-in engine behind a guard, or a process squatting on a port."""

    def __init__(self, body: dict, port: int = 0, statuses: tuple[int, ...] = ()):
        seen = self.seen = []
        payload = json.dumps(body).encode()
        first = list(statuses)

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                seen.append((self.command, self.path, dict(self.headers), self.rfile.read(length)))
                self.send_response(first.pop(0) if first else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Server:
    def __init__(self, model: Path, *flags: str, **env_extra):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, str(STANDIN), "--flags-file", str(FLAGS), str(model),
             "--host", "127.0.0.1", "--port", str(self.port), *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(**env_extra))
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"stand-in exited {self.proc.returncode}: "
                                     f"{self.proc.stdout.read()}")
            try:
                if requests.get(self.base + "/health", timeout=1).status_code == 200:
                    return
            except requests.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise AssertionError("stand-in did not become healthy")

    def client(self, key=KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base + "/v1", api_key=key, max_retries=0, timeout=20)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.stdout.read()


def wait_for(condition, seconds: float = 15):
    """Poll until `condition()` holds (a server still starting may refuse connections meanwhile)."""
    from tests.waiting import wait_until

    return wait_until(condition, seconds, step_s=0.1, ignore=(requests.ConnectionError, OSError))


def _changes_user() -> bool:
    """Root of the host's own user namespace (not `unshare -r`'s mapped root): HAProxy can chroot and setuid."""
    try:
        return os.geteuid() == 0 and open("/proc/self/uid_map").read().split()[:3] == ["0", "0", "4294967295"]
    except OSError:
        return False


def start_haproxy(config: str, tmp, moved: dict[str, str], log=subprocess.DEVNULL) -> subprocess.Popen:
    """The real HAProxy on a rendered config, its host paths moved under `tmp`; checked (`-c`) first. Where it
    cannot change user (not root, or a user namespace), the user, group and chroot lines are dropped: the rest of
    the config is the same. Its log (stdout) goes to `log`."""
    for old, new in moved.items():
        config = config.replace(old, new)
    if not _changes_user():
        config = "\n".join(line for line in config.splitlines()
                           if line.split()[:1] not in (["user"], ["group"], ["chroot"])) + "\n"
    (tmp / "haproxy.cfg").write_text(config)
    check = subprocess.run(["haproxy", "-c", "-f", str(tmp / "haproxy.cfg")], capture_output=True, text=True,
                           check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    return subprocess.Popen(["haproxy", "-f", str(tmp / "haproxy.cfg")], stdout=log, stderr=subprocess.DEVNULL)


@contextlib.contextmanager
def haproxy_serving(config: str, tmp, moved: dict[str, str], url: str):
    """start_haproxy, then `url` once its /health answers 200; stopped after."""
    proc = start_haproxy(config, tmp, moved)
    try:
        wait_for(lambda: requests.get(f"{url}/health", timeout=1).status_code == 200)
        yield url
    finally:
        proc.terminate()
        proc.wait()


def admin_command(admin: str, command: str) -> str:
    """One command on HAProxy's admin socket (`show stat`, `disable server ...`) and its whole answer."""
    import socket

    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(admin)
        sock.sendall(command.encode() + b"\n")
        return b"".join(iter(lambda: sock.recv(65536), b"")).decode()


def door_files(door, directory: Path) -> None:
    """A front door's files as its stage writes them, into `directory` (its FRONT_DOOR_DIR moved there): the maps
    and the usage Lua file, and the status page's viewers where the door offers it."""
    from sparkfleet.contract import monitoring, paths

    for dest, content in ((paths.FRONT_DOOR_USERS_MAP, door.users_map()), (paths.FRONT_DOOR_BACKEND_MAP, door.backend_map()),
                          (paths.FRONT_DOOR_LIMITS_MAP, door.limits_map()),
                          (paths.FRONT_DOOR_USAGE_LUA, (ROOT / "files" / "sparkfleet-usage.lua").read_text())):
        (Path(directory) / Path(dest).name).write_text(content)
    if door.status_page:
        (Path(directory) / Path(monitoring.FRONT_DOOR_VIEWERS_MAP).name).write_text(door.viewers_map())


def guard_files(guard, directory: Path) -> None:
    """A guard's files as its stage writes them, into `directory` (its GUARD_DIR moved there): its key map, and
    the Lua file that answers a door's check where a listener serves one."""
    from sparkfleet.contract import paths

    (Path(directory) / Path(paths.GUARD_KEY_MAP).name).write_text(guard.key_map())
    if guard.ready:
        (Path(directory) / Path(paths.GUARD_READY_LUA).name).write_text(
            (ROOT / "files" / "sparkfleet-ready.lua").read_text())


SAVED: dict[str, tuple[str, str]] = {}  # a test door's URL -> (its admin socket, its usage snapshot)


def save(url: str) -> None:
    """What a front door's timer runs every few seconds: files/sparkfleet-usage-save (its usage counts are reported
    from then on)."""
    subprocess.run(["sh", str(ROOT / "files" / "sparkfleet-usage-save"), *SAVED[url]], check=True, timeout=30)


class NoAddress:
    """A front door runtime's floating-address steps for fakes of it: no floating address, nothing moves."""

    def hand_over(self, hosts, log):
        from sparkfleet.roles.front_door.address import Handover

        return Handover()

    def rejoin(self, step, log):
        pass


class RecordingDoor(NoAddress):
    """FrontDoorRuntime for a fleet command's tests: its drains and returns appended to `calls`, in order, each drain
    checked to be held by `operation` (test_front_door_holds)."""

    def __init__(self, calls: list, operation: str, doors=()):
        self.calls, self.operation, self.doors = calls, operation, list(doors)

    def put_back_stale(self, log):
        return []

    def drain(self, hosts, log, operation=None):
        assert operation == self.operation
        self.calls.append(("drain", list(hosts)))

    def ready(self, hosts, log):
        self.calls.append(("ready", list(hosts)))


class Replier:
    """A listening socket answering each connection with the same bytes, from a thread: once `ready()` (at once
    unless `held`), as a loaded engine or a stats socket would; connections before that wait in its backlog.
    `served` counts the answers."""

    def __init__(self, sock, reply: bytes, held: bool = False):
        self.sock, self.reply, self.served = sock, reply, 0
        self._go = threading.Event()
        if not held:
            self._go.set()
        threading.Thread(target=self._serve, daemon=True).start()

    def ready(self):
        self._go.set()

    def _serve(self):
        self._go.wait()
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(self.reply)
                self.served += 1

    def close(self):
        self.sock.close()
