"""The guard (one HAProxy per host in front of its engines on loopback) and the HAProxy hardening it shares
with the front door: rendered configs and units, values refused before they reach a config, and Debian's
HAProxy itself on loopback in front of the stand-in engine, path by path, with no key, a user key and the
backend key; then a front door in front of that guard."""

from __future__ import annotations

import socket
import time

import pytest
import requests

from sparkfleet.roles.front_door import plan as fd_plan
from sparkfleet.roles import guard as gd
from sparkfleet.roles import haproxy
from sparkfleet.contract import paths
from sparkfleet.release.plan import plan_hosts
from sparkfleet.contract.settings import FrontDoorUser, SettingsError
from tests.conftest import free_port
from tests.tiers import needs

from . import helpers
from .helpers import KEY, door_files, free_api_port, haproxy_serving, host_data, make_model, start_haproxy, wait_for
from .test_tensor_parallel import hub, pair

RAG = {"embed": {"recipe": "qwen3-embedding-0.6b"}, "rerank": {"recipe": "qwen3-reranker-0.6b"}}
USER_KEY = "alice-key-0123456789abcdef"
NAME = "Qwen3.5-35B-A3B"
# vLLM's routes beyond what the fleet serves (the stand-in copies them): open on the LAN before the guard
UNSERVED = ["/rerank", "/v2/rerank", "/score", "/invocations", "/pooling", "/classify", "/tokenize", "/detokenize",
            "/version", "/v1/embeddings", "/v1/rerank", "/v1/score", "/load", "/is_sleeping", "/docs"]


def plan(**over):
    [p] = plan_hosts([("spark-a", host_data(**{"api_host": "0.0.0.0", "api_key": KEY, **over}))], resolve=False)
    return p


def listen_blocks(config: str) -> dict[str, str]:
    """Each `listen` block by name (the node exporter's backend after them left out)."""
    return {block.split("\n", 1)[0].strip(): block.split("\nbackend ")[0]
            for block in config.split("\nlisten ")[1:]}


# --- rendered -------------------------------------------------------------------------------------

def test_every_engine_listens_on_loopback_behind_its_guard():
    p = plan(services=RAG)
    assert p.engine_args[p.engine_args.index("--host") + 1:][:3] == ["127.0.0.1", "--port", "18000"]
    assert [svc.engine_args[svc.engine_args.index("--port") + 1] for svc in p.services] == ["18001", "18002"]
    blocks = listen_blocks(gd.guard_plan(p).config())
    assert list(blocks) == ["chat", "service_embed", "service_rerank"]
    for name, (api, engine) in {"chat": (8000, 18000), "service_embed": (8001, 18001),
                                "service_rerank": (8002, 18002)}.items():
        assert f"    bind 0.0.0.0:{api}\n" in blocks[name]
        assert blocks[name].rstrip().endswith(f"server engine 127.0.0.1:{engine}")


def test_a_non_host_network_publishes_the_engine_on_loopback_only():
    options = plan(docker_network="bridge").docker_options
    assert options[options.index("--publish") + 1] == "127.0.0.1:18000:18000"


@pytest.mark.parametrize("kind, block, allowed", [
    ("chat", "chat",
     "/health /v1/models /v1/chat/completions /v1/completions /metrics /node/metrics /sparkfleet/ready"),
    ("embedding", "service_embed", "/health /v1/models /v1/embeddings /metrics"),
    ("reranker", "service_rerank", "/health /v1/models /v1/rerank /v1/score /metrics"),
])
def test_each_kind_passes_its_own_paths_after_the_key(kind, block, allowed):
    lines = listen_blocks(gd.guard_plan(plan(services=RAG)).config())[block].splitlines()
    key = next(n for n, line in enumerate(lines) if "secure_memcmp(txn.key)" in line)
    refused = next(n for n, line in enumerate(lines) if "return status 401" in line)
    paths_ = next(n for n, line in enumerate(lines) if "return status 404" in line)
    server = next(n for n, line in enumerate(lines) if line.strip().startswith("server "))
    assert key < refused < paths_ < server  # key, then the allow-list, then the engine
    assert "if !{ path -m str /health }" in lines[refused]
    assert lines[paths_].endswith(f"unless {{ path -m str {allowed} }}")
    assert not any("buffer-request" in line or "wait-for-body" in line for line in lines)


def test_the_key_is_only_in_the_root_only_map():
    guard = gd.guard_plan(plan(services=RAG))
    assert guard.key_map() == f"engines Bearer {KEY}\n"
    assert KEY not in guard.config() and KEY not in guard.unit()


def test_without_a_key_the_allow_list_still_applies():
    guard = gd.guard_plan(plan(api_host="127.0.0.1", api_key=None))
    config = guard.config()
    assert "return status 401" not in config and guard.key_map() == ""
    assert ("unless { path -m str /health /v1/models /v1/chat/completions /v1/completions /metrics /node/metrics "
            "/sparkfleet/ready }") in config


def test_a_worker_has_no_chat_guard_and_its_head_has_one():
    plans = {p.name: p for p in plan_hosts(pair(), resolve=hub)}
    assert gd.guard_plan(plans["spark-2"]) is None
    assert list(listen_blocks(gd.guard_plan(plans["spark-1"]).config())) == ["chat"]


def test_api_ports_without_room_for_the_engine_port_are_refused():
    with pytest.raises(SettingsError) as caught:
        plan(api_port=60000, services={"embed": {"recipe": "qwen3-embedding-0.6b", "api_port": 55536}})
    assert [p for p in caught.value.problems if "loopback port" in p] == [
        "spark-a: api_port=60000 leaves no room for its engine's loopback port (api_port + 10000): "
        "set api_port <= 55535",
        "spark-a: services['embed'].api_port=55536 leaves no room for its engine's loopback port "
        "(api_port + 10000): set it <= 55535"]


@pytest.mark.parametrize("config", [
    lambda: gd.guard_plan(plan()).config(),
    lambda: fd_plan.front_door_plan("spark-a", {"spark-a": plan(front_door_users={"alice": USER_KEY},
                                                           front_door_allow_http=True)}).config(),
])
def test_both_haproxys_share_one_hardening(config):
    text = config()
    for line in ("    user haproxy\n", "    group haproxy\n", "    chroot /var/lib/haproxy\n", "    maxconn 500\n",
                 "    ssl-default-bind-options ssl-min-ver TLSv1.2\n", "    timeout http-request 10s\n",
                 "    log stdout format raw local0 info\n"):
        assert line in text
    log_format = next(line for line in text.splitlines() if line.strip().startswith("log-format"))
    assert "user=%[var(txn.user)]" in log_format and "hdr" not in log_format and "%r" not in log_format
    assert "option http-buffer-request" not in text


@pytest.mark.parametrize("unit", [lambda: gd.guard_plan(plan()).unit(),
                                  lambda: fd_plan.front_door_plan("spark-a", {"spark-a": plan(
                                      front_door_users={"alice": USER_KEY}, front_door_allow_http=True)}).unit()])
def test_both_units_are_sandboxed(unit):
    text = unit()
    for line in ("ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes", "NoNewPrivileges=yes",
                 "ProtectKernelTunables=yes", "ProtectKernelModules=yes", "RestrictAddressFamilies=AF_UNIX AF_INET "
                 "AF_INET6", "CapabilityBoundingSet=CAP_NET_BIND_SERVICE CAP_SETUID CAP_SETGID CAP_SYS_CHROOT "
                 "CAP_KILL"):
        assert f"\n{line}\n" in text
    assert "\nMemoryMax=" in text


@pytest.mark.parametrize("value", ["10.0.0.1\n    server evil 6.6.6.6:80", "spark a", "spark'a", "10.0.0.1#x"])
def test_an_ssh_hostname_that_is_not_an_address_never_reaches_a_config(value):
    hosts = [("spark-a", host_data(api_host="0.0.0.0", api_key=KEY, ssh_hostname=value,
                                   front_door_users={"alice": USER_KEY}, front_door_allow_http=True))]
    with pytest.raises(SettingsError) as caught:
        fd_plan.front_door_plan("spark-a", {p.name: p for p in plan_hosts(hosts, resolve=False)})
    (problem,) = caught.value.problems
    assert problem.startswith("spark-a: `ssh_hostname`") and "is invalid" in problem


def test_addresses_land_as_one_word():
    assert haproxy.address("fd00::9", 8000) == "[fd00::9]:8000"
    assert haproxy.address("spark-1.lan", 8000) == "spark-1.lan:8000"
    for bad in ("10.0.0.1 backup", "a\nb", "-x"):
        with pytest.raises(ValueError):
            haproxy.address(bad, 1)
    for bad in ("a b", "x'", "m\n"):
        with pytest.raises(ValueError):
            haproxy.token(bad, "served model name")


# --- Debian's HAProxy on loopback ------------------------------------------------------------------

@pytest.fixture(scope="module")
@needs("haproxy")
def guarded(tmp_path_factory):
    """The stand-in engine on 127.0.0.1:<engine port> and the host's guard on 127.0.0.1:<api port>."""
    tmp = tmp_path_factory.mktemp("guard")
    api_port = free_api_port()
    real = helpers.free_port
    helpers.free_port = lambda: paths.engine_port(api_port)
    try:
        engine = helpers.Server(make_model(tmp / "model"), "--served-model-name", NAME, "--api-key", KEY,
                                SIM_TOKENS_PER_S="500", SIM_FIRST_TOKEN_DELAY_MS="5")
    finally:
        helpers.free_port = real
    [p] = plan_hosts([("spark-a", host_data(api_host="127.0.0.1", api_port=api_port, api_key=KEY))], resolve=False)
    guard = gd.guard_plan(p)
    helpers.guard_files(guard, tmp)
    try:
        with haproxy_serving(guard.config(), tmp, {paths.GUARD_DIR: str(tmp)}, f"http://127.0.0.1:{api_port}") as url:
            yield url, p, engine
    finally:
        engine.stop()


def status(url: str, path: str, key: str | None) -> int:
    return answer(url, path, key).status_code


def engine_answered(url: str, path: str, key: str | None) -> bool:
    """The request reached the engine (200, or the stand-in's own 404 for a route it lacks: /v1/completions)."""
    r = answer(url, path, key)
    return r.status_code == 200 or (r.status_code == 404 and r.json() == {"detail": "Not Found"})


def answer(url: str, path: str, key: str | None) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "prompt": "hi", "max_tokens": 1,
            "input": "hi", "query": "q", "documents": ["d"], "text_1": "a", "text_2": "b"}
    method = "GET" if path in ("/health", "/metrics", "/v1/models", "/version", "/docs", "/is_sleeping") else "POST"
    return requests.request(method, url + path, headers=headers, json=body, timeout=10)


def test_the_engine_itself_answers_unserved_paths_with_no_key(guarded):
    """What the guard is for: vLLM's own key check covers only /v1/* (the stand-in copies it)."""
    _, _, engine = guarded
    assert status(engine.base, "/metrics", None) == 200
    assert status(engine.base, "/rerank", None) not in (401, 403)


@pytest.mark.parametrize("key", [None, USER_KEY, KEY[:-1], f"{KEY}x", KEY.upper()])
def test_without_the_backend_key_every_path_but_health_is_401(guarded, key):
    url, _, _ = guarded
    assert status(url, "/health", key) == 200
    for path in ["/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions", *UNSERVED]:
        assert status(url, path, key) == 401, path


def test_with_the_backend_key_only_the_engines_paths_pass(guarded):
    url, _, _ = guarded
    for path in ["/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions"]:
        assert engine_answered(url, path, KEY), path
    for path in [*UNSERVED, "/v1/models/../metrics", "/%6detrics", "//metrics", "/metrics/", "/v1/Models"]:
        assert status(url, path, KEY) == 404, path


def test_the_401_comes_before_any_body_is_read(guarded):
    url, _, _ = guarded
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100000000\r\n\r\n{")
        started = time.monotonic()
        head = sock.recv(200)
    assert head.startswith(b"HTTP/1.1 401") and time.monotonic() - started < 2


@pytest.fixture(scope="module")
def door_over_guard(guarded, tmp_path_factory):
    """A front door whose backend is the guarded host, as on a fleet: user keys in, the backend key out."""
    _, p, _ = guarded
    tmp = tmp_path_factory.mktemp("door")
    door_port = free_port()
    settings = p.settings.model_copy(update={"front_door_users": {"alice": FrontDoorUser(key=USER_KEY)}, "front_door_allow_http": True,
                                             "front_door_port": door_port})
    door = fd_plan.FrontDoor("spark-a", settings, (fd_plan.Backend("spark-a", "127.0.0.1", p.settings.api_port),), KEY)
    door_files(door, tmp)
    with haproxy_serving(door.config(), tmp, {paths.FRONT_DOOR_DIR: str(tmp), paths.FRONT_DOOR_SOCKET: str(tmp / "admin.sock"),
                                              paths.FRONT_DOOR_STATE_FILE: str(tmp / "state"),
                                              f"bind :{door_port}": f"bind 127.0.0.1:{door_port}"},
                         f"http://127.0.0.1:{door_port}") as url:
        yield url


def test_a_user_key_reaches_exactly_the_allow_listed_paths(door_over_guard):
    url = door_over_guard
    assert status(url, "/health", None) == 200
    for path in ["/v1/models", "/v1/chat/completions", "/v1/completions"]:
        assert engine_answered(url, path, USER_KEY), path
        assert status(url, path, None) == 401 and status(url, path, KEY) == 401
    for path in ["/metrics", *UNSERVED]:
        assert status(url, path, USER_KEY) == 404, path
        assert status(url, path, None) == 401, path


def test_the_front_doors_401_comes_before_any_body_is_read(door_over_guard):
    port = int(door_over_guard.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n{")
        started = time.monotonic()
        head = sock.recv(200)
    assert head.startswith(b"HTTP/1.1 401") and time.monotonic() - started < 2


@pytest.mark.haproxy
def test_node_metrics_on_the_api_port_only_with_the_backend_key(tmp_path):
    """The guard's API port answers the node exporter's metrics (on loopback behind it) with the backend key alone,
    on every host, monitored or not (the same config either way)."""
    import http.server
    import threading

    class Exporter(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = f"node_seen_path{{path=\"{self.path}\"}} 1\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    exporter = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=exporter.serve_forever, daemon=True).start()
    api_port = free_api_port()
    [p] = plan_hosts([("spark-a", host_data(api_host="127.0.0.1", api_port=api_port, api_key=KEY))], resolve=False)
    guard = gd.guard_plan(p)
    helpers.guard_files(guard, tmp_path)
    proc = start_haproxy(guard.config(), tmp_path, {paths.GUARD_DIR: str(tmp_path),
                                                    "127.0.0.1:9100": f"127.0.0.1:{exporter.server_port}"})
    url = f"http://127.0.0.1:{api_port}/node/metrics"
    try:
        wait_for(lambda: requests.get(url, timeout=1).status_code == 401)
        answer = requests.get(url, headers={"Authorization": f"Bearer {KEY}"}, timeout=5)
        assert answer.status_code == 200 and 'node_seen_path{path="/metrics"} 1' in answer.text
        assert requests.get(url, headers={"Authorization": f"Bearer {USER_KEY}"}, timeout=5).status_code == 401
        assert requests.get(url.replace("/node/", "/nodes/"), headers={"Authorization": f"Bearer {KEY}"},
                            timeout=5).status_code == 404
    finally:
        proc.terminate()
        proc.wait()
        exporter.shutdown()
