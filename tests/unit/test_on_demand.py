"""On-demand models: a service marked `on_demand` is started by the first request naming it (systemd's socket on
loopback, its proxy requiring the engine's unit) and stopped after its idle time; it must fit beside every always-on
engine, not beside the other on-demand ones; its guard answers /health itself and holds a bounded number of requests
while it starts (503 past it)."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sparkfleet.contract import paths
from sparkfleet.roles import guard as gd
from sparkfleet.roles.front_door import plan as fd_plan
from sparkfleet.release.plan import plan_hosts
from tests.tiers import needs
from tests.unit import helpers
from tests.unit.helpers import KEY, Replier, free_api_port, haproxy_serving, host_data
from tests.unit.test_chat_services import CODER, CODER_NAME
from tests.unit.test_front_door import plans
from tests.unit.test_services import fake_resolver, plan, refused
from tests.waiting import wait_until

GIB = 1024**3
EMBED = {"recipe": "qwen3-embedding-0.6b"}


def on_demand_host(embed: dict | None = None, **over):
    """The chat model at 0.5, a coder on demand at 0.4 and an embedding model on demand at 0.3: each on-demand one
    fits beside the chat model (0.9, 0.8), both together do not (1.2)."""
    services = {"coder": {**CODER, "kv_cache_memory_bytes": None, "gpu_memory_utilization": 0.4, "on_demand": True},
                "embed": {**EMBED, "gpu_memory_utilization": 0.3, "on_demand": True, **(embed or {})}}
    return plan(gpu_memory_utilization=0.5, services=services, **over)


def test_on_demand_models_must_fit_beside_the_always_on_ones_not_beside_each_other():
    host = on_demand_host()
    memory = host.memory_plan
    assert memory["fits"] and memory["total"] == 0.9  # the chat's 0.5 and the largest on-demand 0.4
    assert {name: row.get("on_demand", False) for name, row in memory["shares"].items()} == {
        "chat": False, "coder": True, "embed": True}
    # always-on engines start first: an on-demand one never holds up a boot
    assert memory["start"]["order"][0] == paths.UNIT_NAME


def test_an_on_demand_model_that_does_not_fit_beside_the_always_on_ones_is_refused_in_one_line():
    [line] = refused(gpu_memory_utilization=0.7, services={
        "embed": {**EMBED, "gpu_memory_utilization": 0.3, "on_demand": True}})
    assert line.startswith("spark-a: the host's GPU memory is oversubscribed: the always-on shares and the largest "
                           "on-demand one sum to 1 > gpu_memory_budget 0.95: chat 0.7 (89.6 GB), embed 0.3 (38.4 GB) "
                           "on demand.")
    assert "mark a rarely used service on_demand, or move a service to another host" in line


def test_always_on_services_plan_as_before():
    """No on-demand key, no on-demand trace: the memory plan, the units and the guard of today's inventories."""
    host = plan(services={"embed": EMBED})
    assert "on_demand" not in json.dumps(host.memory_plan) and "on_demand" not in json.dumps(host.release_record())
    unit = host.render_service_unit(host.services[0])
    assert "StopWhenUnneeded" not in unit and unit.endswith("[Install]\nWantedBy=multi-user.target\n")
    assert "stats socket" not in gd.guard_plan(host).config()


def test_the_units_of_an_on_demand_model():
    host = on_demand_host(on_demand_idle_s=600)
    coder = host.services[0]
    port = paths.engine_port(8003)
    engine = host.render_service_unit(coder)
    assert "StopWhenUnneeded=yes" in engine and "[Install]" not in engine
    assert f"--port {port}" in engine  # the engine keeps its own loopback address; the socket takes another
    socket_unit = host.render_on_demand_socket(coder)
    assert f"ListenStream={paths.ON_DEMAND_HOST}:{port}\n" in socket_unit
    assert "Service=sparkfleet-ondemand-coder.service\n" in socket_unit and "WantedBy=sockets.target" in socket_unit
    proxy = host.render_on_demand_proxy(coder)
    assert "Requires=sparkfleet-vllm-coder.service sparkfleet-ondemand-coder.socket\n" in proxy
    assert f"ExecStart={paths.SOCKET_PROXYD} --exit-idle-time=600s 127.0.0.1:{port}\n" in proxy
    assert f"ExecStartPre={paths.ON_DEMAND_HELPER} wait 127.0.0.1:{port} 900 {paths.SERVING_FILE}\n" in proxy
    # an entry's own idle time wins over the host's
    own = on_demand_host(embed={"on_demand_idle_s": 30})
    assert "--exit-idle-time=30s " in own.render_on_demand_proxy(own.services[1])
    record = host.release_record()["services"]["coder"]
    assert record["on_demand"] == {"socket": "sparkfleet-ondemand-coder.socket",
                                   "proxy": "sparkfleet-ondemand-coder.service"}


def test_marking_a_service_on_demand_is_a_new_release_of_it():
    always, demand = (plan_hosts([("spark-a", host_data(gpu_memory_utilization=0.5, services={"embed": {
        **EMBED, "gpu_memory_utilization": 0.3, **extra}}))], resolve=fake_resolver())[0]
        for extra in ({}, {"on_demand": True}))
    assert always.release_id != demand.release_id and always.chat_release_id == demand.chat_release_id


@pytest.mark.parametrize("entry, setting, why", [
    ({"on_demand": "sometimes"}, "services['embed']['on_demand']", "boolean"),
    ({"on_demand": True, "on_demand_idle_s": 5}, "services['embed']['on_demand_idle_s']",
     "greater than or equal to 10"),
    ({"on_demand": True, "on_demand_idle_s": "600; rm -rf /"}, "services['embed']['on_demand_idle_s']", "integer"),
])
def test_hostile_on_demand_entries_are_refused_naming_the_key(entry, setting, why):
    [line] = refused(services={"embed": {**EMBED, **entry}})
    assert setting in line and why in line


def test_an_idle_time_on_an_always_on_service_is_refused_with_the_fix():
    [line] = refused(services={"embed": {**EMBED, "on_demand_idle_s": 600}})
    assert line == ("spark-a: service 'embed' (setting `services`): on_demand_idle_s is set but the service is always "
                    "on: set `on_demand` to true, or remove on_demand_idle_s")


@pytest.mark.parametrize("setting, value, why", [
    ("on_demand_max_waiting", 0, "greater than or equal to 1"),
    ("on_demand_max_waiting", 100_000, "less than or equal to 4096"),
    ("on_demand_idle_s", 9, "greater than or equal to 10"),
])
def test_hostile_host_on_demand_settings_are_refused(setting, value, why):
    [line] = refused(**{setting: value})
    assert f"`{setting}`" in line and why in line


def test_the_front_door_lists_an_on_demand_model_and_checks_it_without_starting_it():
    fleet = plans(**{"spark-a": {"gpu_memory_utilization": 0.5, "services": {"coder": {**CODER, "on_demand": True}}}})
    door = fd_plan.front_door_plan("spark-a", fleet)
    assert CODER_NAME in door.served_names
    [route] = [r for r in door.routes if r.served_name == CODER_NAME]
    assert route.check == ("GET", "/health", "")  # the guard answers it itself
    block = door.config().split(f"backend {route.backend}\n")[1].split("\nbackend ")[0]
    [check] = [line for line in block.splitlines() if "http-check send" in line]
    assert check.strip() == "http-check send meth GET uri /health ver HTTP/1.1 hdr Host front-door"


# --- Debian's HAProxy on loopback: the hold and its cap ------------------------------------------

def starting(port: int) -> Replier:
    """An on-demand model's socket while its engine starts: connections wait in the backlog, none is answered until
    `ready()`; then each is answered 200, as the loaded engine would."""
    body = b'{"ok": true}'
    return Replier(socket.create_server((paths.ON_DEMAND_HOST, port), backlog=64),
                   b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(body), body), held=True)


def at_engine_and_queued(stats_socket: str, proxy: str) -> tuple[int, int]:
    """HAProxy's own count of one listener's requests: at its engine (the server's sessions) and queued in the guard
    (the backend's queue), read from the guard's stats socket."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(stats_socket)
        sock.sendall(b"show stat\n")
        answer = b"".join(iter(lambda: sock.recv(65536), b"")).decode()
    header, *lines = answer.splitlines()
    fields = header.lstrip("# ").split(",")
    rows = [dict(zip(fields, line.split(","), strict=True)) for line in lines if line]
    mine = {row["svname"]: row for row in rows if row["pxname"] == proxy}
    return int(mine["engine"]["scur"]), int(mine["BACKEND"]["qcur"])


@needs("haproxy")
def test_the_guard_holds_a_stopped_models_requests_up_to_its_cap_then_503s(tmp_path):
    api_port = free_api_port()
    [host] = plan_hosts([("spark-a", host_data(
        api_host="127.0.0.1", api_key=KEY, gpu_memory_utilization=0.5, on_demand_max_waiting=2,
        services={"embed": {**EMBED, "api_port": api_port, "gpu_memory_utilization": 0.3, "on_demand": True}}))],
        resolve=False)
    guard = gd.guard_plan(host)
    [listener] = [listener for listener in guard.listeners if listener.on_demand]
    helpers.guard_files(guard, tmp_path)
    engine = starting(paths.engine_port(api_port))
    moved = {paths.GUARD_DIR: str(tmp_path), f"/run/{paths.GUARD_RUNTIME_NAME}": str(tmp_path)}
    url = f"http://127.0.0.1:{api_port}"
    stats = str(tmp_path / paths.GUARD_STATS_SOCKET.rsplit("/", 1)[1])  # under the moved /run directory
    try:
        with haproxy_serving(guard.config(), tmp_path, moved, url):
            # /health is the guard's own answer: the door's checks never start the model
            assert requests.get(f"{url}/health", timeout=5).json() == {"status": "on demand"}
            assert engine.served == 0

            def ask(_):
                return requests.post(f"{url}/v1/embeddings", json={"model": "m", "input": "x"},
                                     headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
            with ThreadPoolExecutor(5) as pool:
                held = [pool.submit(ask, n) for n in range(4)]
                # 2 in flight at the socket, 2 queued at the guard: as HAProxy counts them, before the fifth
                wait_until(lambda: at_engine_and_queued(stats, listener.name) == (2, 2), 10,
                           "2 requests at the engine and 2 queued in the guard", step_s=0.05)
                over = ask(4)
                assert over.status_code == 503
                assert "holds as many requests as it may" in over.json()["error"]["message"]
                assert not any(f.done() for f in held)  # the others are still held
                engine.ready()
                assert [f.result().status_code for f in held] == [200] * 4
            assert engine.served == 4
    finally:
        engine.close()
