"""The front door routes chat by model name: hosts serving other chat models (each its own engine) get a route by
the body's "model", the door lists every served name on /v1/models, and usage counts each name; the default
single-model config is unchanged (test_front_door.py holds that). Config checks here, then the real HAProxy on
loopback in front of three stand-in engines, one per served name."""

from __future__ import annotations

import base64
import json
import socket

import pytest
import requests

from sparkfleet.contract import monitoring, paths
from sparkfleet.roles import guard as gd
from sparkfleet.roles.front_door import plan as fd_plan
from sparkfleet.fleet.front_door import runtime as fd_runtime
from sparkfleet.contract.settings import SettingsError

from tests.tiers import needs
from .helpers import KEY, SAVED, Server, door_files, make_model, save, start_haproxy, wait_for
from .test_front_door import ALICE, NAME, plans

SGLANG, LLAMA = "Qwen3.5-35B-A3B-sglang", "tiny-llama"
FLEET = {"spark-1": {}, "spark-2": {"served_model_name": SGLANG, "recipe": "qwen3.5-35b-a3b-fp8-sglang"},
         "spark-3": {"served_model_name": LLAMA, "recipe": "qwen3-8b-gguf"}}


def test_each_other_chat_model_gets_a_route_of_its_hosts():
    planned = plans(**FLEET, **{"spark-4": {"served_model_name": LLAMA}})
    door = fd_plan.front_door_plan("spark-1", planned)
    assert door.backends == (fd_plan.Backend("spark-1", "10.0.0.1", 8000),)
    assert [(r.backend, r.served_name, r.kind, [b.name for b in r.backends]) for r in door.chat_routes] == [
        ("chat_0", SGLANG, "chat", ["spark-2"]), ("chat_1", LLAMA, "chat", ["spark-3", "spark-4"])]
    config = door.config()
    assert (f"use_backend chat_1 if {{ var(txn.model) -m str {LLAMA} }} "
            "{ path -m str /v1/chat/completions /v1/completions }") in config
    assert "backend chat_1\n" in config
    assert (f"    server spark-3 10.0.0.3:8000 id {fd_plan.server_id('spark-3')}\n"
            f"    server spark-4 10.0.0.4:8000 id {fd_plan.server_id('spark-4')}\n") in config
    # each route checks its hosts through their guards, with the one backend key; each guard's chat probe asks its
    # own model (roles/guard.py ready_check)
    block = config.split("backend chat_1\n", 1)[1].split("\nbackend ", 1)[0]
    assert f"http-check send meth GET uri {gd.READY_PATH} " in block and "hdr Authorization " in block
    [listener] = gd.guard_plan(planned["spark-3"]).listeners
    assert json.loads(base64.b64decode(listener.ready["probe"]))["model"] == LLAMA
    assert config.count("balance hash var(txn.conversation)") == 3
    assert KEY not in config and ALICE not in config


def test_the_door_lists_every_served_name_and_counts_each():
    door = fd_plan.front_door_plan("spark-1", plans(**FLEET))
    assert door.served_names == tuple(sorted((NAME, SGLANG, LLAMA)))
    listed = json.loads(door.models_answer().strip("'"))
    assert [m["id"] for m in listed["data"]] == sorted((NAME, SGLANG, LLAMA)) and listed["object"] == "list"
    assert door.usage()["models"] == sorted((NAME, SGLANG, LLAMA))
    assert f"-m str {' '.join(sorted((NAME, SGLANG, LLAMA)))} }}" in door.config()  # the usage's served names
    summary = fd_plan.door_summary(door)
    assert summary["models"] == sorted((NAME, SGLANG, LLAMA))
    assert ("route tiny-llama", "chat: spark-3") in fd_plan.door_rows(summary)


def test_drain_addresses_the_door_models_engines_only():
    """Drain sets `engines/HOST` aside: another model's hosts (chat_N) are not in the states drain checks, so it
    refuses them (naming another served model) instead of claiming a drain it did not make."""
    stat = ("# pxname,svname,qcur,qmax,scur,smax,status,weight\nengines,spark-1,0,0,0,1,UP,1\n"
            "chat_0,spark-2,0,0,1,1,UP,1\nchat_1,spark-3,0,0,0,1,DOWN,1\n")
    assert set(fd_runtime.backend_states(stat)) == {"spark-1"}


def test_one_chat_model_keeps_its_engines_answering_v1_models():
    door = fd_plan.front_door_plan("spark-1", plans(**{"spark-1": {}, "spark-2": {}}))
    assert door.chat_routes == () and door.models_answer() is None
    assert "/v1/models } METH_GET" not in door.config() and "chat_0" not in door.config()


def test_a_host_the_door_cannot_take_is_left_out_and_shown():
    door = fd_plan.front_door_plan("spark-1", plans(**FLEET, **{
        "spark-4": {"served_model_name": "dev", "api_host": "127.0.0.1"},
        "spark-5": {"served_model_name": "other", "api_key": "another-key-0123456789"}}))
    assert door.left_out == (("spark-4", "dev: its api_host is loopback"),
                             ("spark-5", "other: its api_key is not the one this door sends"))
    assert "spark-4" not in door.config() and "spark-5" not in door.config()
    rows = dict(fd_plan.door_rows(fd_plan.door_summary(door)))
    assert rows["not behind it: spark-5"] == "other: its api_key is not the one this door sends"


def test_a_chat_model_named_like_a_rag_service_is_refused():
    service = {"services": {"embed": {"recipe": "qwen3-embedding-0.6b", "served_model_name": SGLANG}}}
    with pytest.raises(SettingsError) as exc:
        fd_plan.front_door_plan("spark-1", plans(**{**FLEET, "spark-1": service}))
    assert any(f"{SGLANG!r} is served by a chat engine (spark-2) and a service" in p for p in exc.value.problems)


def test_a_service_named_like_the_doors_own_model_is_refused():
    """A second chat model on spark-1 under the fleet's default name: the door could not tell them apart."""
    twin = {"services": {"twin": {"recipe": "qwen3.5-35b-a3b-fp8", "api_port": 8003, "served_model_name": NAME,
                                  "gpu_memory_utilization": 0.4}}, "gpu_memory_utilization": 0.5}
    with pytest.raises(SettingsError) as exc:
        fd_plan.front_door_plan("spark-1", plans(**{**FLEET, "spark-1": twin}))
    assert any(f"{NAME!r} is this front door's own model and a service's (spark-1): give the service its own "
               "served_model_name" in p for p in exc.value.problems), exc.value.problems


# --- HAProxy itself, on loopback: a chat naming each model reaches its host ------------------------------

@pytest.fixture(scope="module")
@needs("haproxy")
def door(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("door")
    model = make_model(tmp / "model")
    names = {"spark-1": NAME, "spark-2": SGLANG, "spark-3": LLAMA}
    engines = {host: Server(model, "--served-model-name", served, "--api-key", KEY) for host, served in names.items()}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    planned = fd_plan.front_door_plan("spark-1", plans(**FLEET))

    def moved(route: fd_plan.Route) -> fd_plan.Route:  # the stand-ins stand for the hosts' guards
        return fd_plan.Route(route.backend, route.served_name, route.kind,
                        tuple(fd_plan.Backend(b.name, "127.0.0.1", engines[b.name].port) for b in route.backends))

    door = fd_plan.FrontDoor(planned.host, planned.settings.model_copy(update={"front_door_port": port}),
                        (fd_plan.Backend("spark-1", "127.0.0.1", engines["spark-1"].port),), planned.api_key,
                        chat_routes=tuple(map(moved, planned.chat_routes)))
    door_files(door, tmp)
    proc = start_haproxy(door.config(), tmp, {
        paths.FRONT_DOOR_DIR: str(tmp), paths.FRONT_DOOR_SOCKET: str(tmp / "admin.sock"),
        paths.FRONT_DOOR_STATE_FILE: str(tmp / "state"), f"bind :{port}": f"bind 127.0.0.1:{port}",
        paths.FRONT_DOOR_USAGE_SNAPSHOT: str(tmp / "usage.snapshot")})
    url = f"http://127.0.0.1:{port}"
    SAVED[url] = (str(tmp / "admin.sock"), str(tmp / "usage.snapshot"))
    try:
        wait_for(lambda: all(ask(url, served).status_code == 200 for served in names.values()), 30)
        yield url
    finally:
        proc.terminate()
        proc.wait()
        for e in engines.values():
            e.stop()


def ask(url: str, model: str | None) -> requests.Response:
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2, **({"model": model} if model else {})}
    return requests.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {ALICE}"}, json=body,
                         timeout=10)


def test_a_chat_naming_each_model_reaches_its_host(door):
    for served in (NAME, SGLANG, LLAMA):
        answer = ask(door, served)
        assert answer.status_code == 200 and answer.json()["model"] == served, answer.text[:300]
    unnamed = requests.post(f"{door}/v1/chat/completions", headers={"Authorization": f"Bearer {ALICE}"}, timeout=10,
                            json={"model": NAME, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
    assert unnamed.json()["model"] == NAME


def test_v1_models_through_the_door_lists_the_fleet_and_needs_a_key(door):
    listed = requests.get(f"{door}/v1/models", headers={"Authorization": f"Bearer {ALICE}"}, timeout=5)
    assert listed.status_code == 200 and sorted(m["id"] for m in listed.json()["data"]) == sorted((NAME, SGLANG, LLAMA))
    assert requests.get(f"{door}/v1/models", timeout=5).status_code == 401


def test_usage_counts_each_served_name(door):
    ask(door, LLAMA)
    save(door)  # what the door's timer does: the counts are reported once saved
    text = requests.get(door + monitoring.USAGE_METRICS_PATH, headers={"Authorization": f"Bearer {KEY}"},
                        timeout=5).text
    for served in (NAME, SGLANG, LLAMA):
        assert f'sparkfleet_user_requests_total{{user="alice",model="{served}"}}' in text, text
