"""The front door: its HAProxy config from the inventory, refused inventories, and HAProxy itself on loopback
in front of two stand-in engines (keys, affinity, drain, health routing)."""

from __future__ import annotations

import socket

import pytest
import requests

from sparkfleet.contract import paths
from sparkfleet.roles import guard as gd, haproxy
from sparkfleet.roles.front_door import plan as fd_plan
from sparkfleet.fleet.front_door import runtime as fd_runtime
from sparkfleet.roles.front_door import records as fd_records
from sparkfleet.release.plan import plan_hosts
from sparkfleet.contract.settings import SettingsError, parse_settings

from sparkfleet.contract.monitoring import FRONT_DOOR_METRICS_PATH

from tests.tiers import needs
from .helpers import KEY, Server, admin_command, door_files, host_data, make_model, start_haproxy, wait_for

ALICE, BOB = "alice-key-0123456789abcdef", "bob-key-0123456789abcdef"
NAME = "Qwen3.5-35B-A3B"


def plans(**per_host):
    """Offline plans of hosts serving with a LAN API and a key; per_host: name -> overrides."""
    base = {"api_host": "0.0.0.0", "api_key": KEY, "front_door_users": {"alice": ALICE, "bob": BOB},
            "front_door_allow_http": True}
    hosts = [(name, host_data(**{**base, "lan_address": f"10.0.0.{n}", **over}))
             for n, (name, over) in enumerate(per_host.items(), 1)]
    return {p.name: p for p in plan_hosts(hosts, resolve=False)}


def test_backends_are_the_hosts_serving_the_same_model():
    door = fd_plan.front_door_plan("spark-a", plans(**{"spark-a": {}, "spark-b": {"api_port": 8001},
                                                  "spark-c": {"served_model_name": "other"}}))
    assert door.backends == (fd_plan.Backend("spark-a", "10.0.0.1", 8000), fd_plan.Backend("spark-b", "10.0.0.2", 8001))
    config = door.config()
    ids = fd_plan.server_id("spark-a"), fd_plan.server_id("spark-b")
    assert f"    server spark-a 10.0.0.1:8000 id {ids[0]}\n    server spark-b 10.0.0.2:8001 id {ids[1]}\n" in config
    # spark-c serves another model: not an engine of this one, but its own route (test_front_door_models.py)
    assert "spark-c" not in config.split("backend engines\n")[1].split("\nbackend ")[0]
    assert [r.served_name for r in door.chat_routes] == ["other"]
    assert "bind :8080\n" in config
    # the health check asks each engine's guard (whose chat probe asks the served model for one token:
    # test_door_ready.py)
    assert f"http-check send meth GET uri {gd.READY_PATH} ver HTTP/1.1 " in config


def test_keys_live_only_in_the_maps():
    door = fd_plan.front_door_plan("spark-a", plans(**{"spark-a": {}}))
    assert door.users_map() == f"{ALICE} alice\n{BOB} bob\n"
    assert door.backend_map() == f"engines Bearer {KEY}\n"
    for secret in (ALICE, BOB, KEY):
        assert secret not in door.config() and secret not in door.unit()


def test_tls_binds_with_the_pem(tmp_path):
    (tmp_path / "c.pem").write_text("CERT\n")
    (tmp_path / "k.pem").write_text("KEY\n")
    door = fd_plan.front_door_plan("spark-a", plans(**{"spark-a": {"front_door_tls_cert": str(tmp_path / "c.pem"),
                                                              "front_door_tls_key": str(tmp_path / "k.pem")}}))
    assert f"bind :8080 ssl crt {paths.FRONT_DOOR_TLS_PEM}\n" in door.config()
    assert door.tls_pem() == "CERT\nKEY\n"


@pytest.mark.parametrize("hosts, expected", [
    ({"spark-a": {"api_host": "127.0.0.1"}},
     ("spark-a: api_host 127.0.0.1 is loopback, out of the front door's reach: set api_host to a LAN address "
     "(or 0.0.0.0) with an api_key")),
    ({"spark-a": {}, "spark-b": {"api_key": "another-key"}},
     ("spark-a: the backends of 'Qwen3.5-35B-A3B' have different `api_key`s: the front door sends one; set one "
     "api_key for them all (e.g. in group_data)")),
    ({"spark-a": {"front_door_users": {"alice": ALICE, "bob": ALICE}}},
     "spark-a: setting `front_door_users`: two users share one key: give each their own"),
    ({"spark-a": {"api_key": ALICE}},
     ("spark-a: setting `front_door_users`: a user key equals the backends' api_key: clients must never hold "
     "the engines' key")),
    ({"spark-a": {"front_door_port": 8000}},
     ("spark-a: setting `front_door_port` = 8000 is taken by the engine or the model share on this host: pick "
     "another port")),
    ({"spark-a": {"front_door_port": 18000}},
     ("spark-a: setting `front_door_port` = 18000 is taken by the engine or the model share on this host: pick "
     "another port")),
    ({"spark-a": {"front_door_tls_cert": "/etc/c.pem"}},
     "spark-a: set both `front_door_tls_cert` and `front_door_tls_key`, or neither"),
    ({"spark-a": {"front_door_allow_http": False}},
     ("spark-a: the front door would take its users' keys over plain http: set `front_door_tls_cert` and "
      "`front_door_tls_key`, or `front_door_allow_http = True` on a trusted LAN")),
])
def test_refused_inventories_name_the_host_and_the_fix(hosts, expected):
    with pytest.raises(SettingsError) as exc:
        fd_plan.front_door_plan("spark-a", plans(**hosts))
    assert exc.value.problems == [expected]
    assert ALICE not in str(exc.value)


def test_a_door_without_users_may_speak_plain_http():
    assert not fd_plan.front_door_plan("spark-a", plans(**{"spark-a": {"front_door_users": {},
                                                                  "front_door_allow_http": False}})).tls


def test_the_key_and_the_path_are_decided_before_any_body_is_read():
    lines = [line.strip() for line in fd_plan.front_door_plan("spark-a", plans(**{"spark-a": {}})).config().splitlines()]
    order = [next(n for n, line in enumerate(lines) if line.startswith(start)) for start in (
        "http-request set-var(txn.user)", "http-request return status 401 content-type application/json string "
        f"{haproxy.AUTH_401} unless", "http-request return status 404", "http-request track-sc0",
        "http-request return status 429", "http-request wait-for-body", "http-request set-var(txn.role0) req.body")]
    assert order == sorted(order)
    assert lines[order[2]].endswith("unless { path -m str /v1/chat/completions /v1/completions /v1/models }")
    assert not any("http-buffer-request" in line for line in lines)


def test_a_backend_without_a_key_is_refused():
    all_plans = plans(**{"spark-a": {}})
    all_plans["spark-b"] = plan_hosts([("spark-b", host_data(api_host="0.0.0.0", allow_unauthenticated_api=True))],
                                      resolve=False)[0]
    with pytest.raises(SettingsError) as exc:
        fd_plan.front_door_plan("spark-a", all_plans)
    assert ("spark-b: setting `api_key` is missing: behind a front door every engine needs the key only the "
            "front door holds") in exc.value.problems


def test_a_short_user_key_is_refused_without_echoing_it():
    with pytest.raises(SettingsError) as exc:
        parse_settings("spark-a", host_data(front_door_users={"carol": "short-key"}))
    assert exc.value.problems == [("spark-a: setting `front_door_users['carol']['key']` is invalid: must be at least 16 "
                                   "of letters, digits and . _ ~ + / = -, at most 255 characters; fix it in the "
                                   "inventory or group_data")]


def test_runtime_command_is_one_quoted_line():
    assert fd_records.runtime_command("set server engines/spark-a state drain", "show stat") == (
        "echo 'set server engines/spark-a state drain; show stat' | socat -t 5 stdio "
        "UNIX-CONNECT:/run/sparkfleet-front-door/admin.sock")


STAT = """# pxname,svname,qcur,qmax,scur,smax,status,weight
api,FRONTEND,,,1,3,OPEN,
engines,spark-a,0,0,0,1,UP,1
engines,spark-b,0,0,2,2,DRAIN,1
engines,spark-c,0,0,0,1,DRAIN,1
engines,spark-d,0,0,0,1,MAINT,1
engines,spark-e,0,0,0,1,DOWN 1/2,1
engines,spark-f,0,0,0,1,UP 1/2,1
engines,BACKEND,0,0,2,3,UP,4
"""


def test_backend_states_from_show_stat():
    assert {name: row["state"] for name, row in fd_runtime.backend_states(STAT).items()} == {
        "spark-a": "in", "spark-b": "draining", "spark-c": "out", "spark-d": "out", "spark-e": "down",
        "spark-f": "in"}
    assert fd_runtime.backend_states(STAT)["spark-b"]["sessions"] == 2


# --- HAProxy itself, on loopback -------------------------------------------------------------------

@pytest.fixture(scope="module")
@needs("haproxy")
def haproxy_door(tmp_path_factory):
    """Debian's HAProxy with the generated config (paths moved into a temp dir), in front of two stand-ins."""
    tmp = tmp_path_factory.mktemp("door")
    model = make_model(tmp / "model")
    engines = [Server(model, "--served-model-name", NAME, "--api-key", KEY, "--enable-prefix-caching",
                      SIM_TOKENS_PER_S="500", SIM_FIRST_TOKEN_DELAY_MS="5") for _ in range(2)]
    names = ("spark-a", "spark-b")
    all_plans = plans(**{n: {"lan_address": "127.0.0.1"} for n in names})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    door = fd_plan.front_door_plan("spark-a", {**all_plans, "spark-a": all_plans["spark-a"]})
    # the stand-ins stand for the hosts' guards: each backend is one of them
    door = fd_plan.FrontDoor(door.host, door.settings.model_copy(update={"front_door_port": port}),
                        tuple(fd_plan.Backend(b.name, "127.0.0.1", e.port) for b, e in zip(door.backends, engines)),
                        door.api_key)
    moved = {paths.FRONT_DOOR_DIR: str(tmp), paths.FRONT_DOOR_SOCKET: str(tmp / "admin.sock"), paths.FRONT_DOOR_STATE_FILE: str(tmp / "state"),
             f"bind :{port}": f"bind 127.0.0.1:{port}"}
    door_files(door, tmp)
    proc = start_haproxy(door.config(), tmp, moved)
    url = f"http://127.0.0.1:{port}"
    admin = str(tmp / "admin.sock")

    def runtime(command: str) -> str:
        return admin_command(admin, command)

    try:
        wait_for(lambda: requests.get(f"{url}/health").status_code == 200 and
                 {r["state"] for r in fd_runtime.backend_states(runtime("show stat")).values()} == {"in"})
        yield url, dict(zip(names, engines)), runtime
    finally:
        proc.terminate()
        proc.wait()
        for e in engines:
            e.stop()


def chat(url: str, key: str | None, messages: list[dict], stream: bool = False) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.post(f"{url}/v1/chat/completions", headers=headers, stream=stream,
                         json={"model": NAME, "messages": messages, "max_tokens": 4, "stream": stream})


def served(engines: dict) -> dict[str, float]:
    """Chat completions each engine has finished (its own /metrics)."""
    out = {}
    for name, e in engines.items():
        text = requests.get(f"{e.base}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
        out[name] = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                        if line.startswith("vllm:request_success_total") and 'finished_reason="abort"' not in line)
    return out


def test_user_keys_open_the_door_and_the_engine_key_does_not(haproxy_door):
    url, _, _ = haproxy_door
    hello = [{"role": "user", "content": "hello"}]
    assert chat(url, ALICE, hello).status_code == 200
    assert chat(url, BOB, hello, stream=True).status_code == 200
    for key in (None, KEY, "not-a-user-key-000000"):
        refused = chat(url, key, hello)
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "AuthenticationError"
    answer = chat(url, ALICE, hello)
    assert KEY not in answer.text and KEY not in str(answer.headers)


def test_haproxy_metrics_answer_only_the_backend_key(haproxy_door):
    """Prometheus (holding the backend key) reads HAProxy's exporter; a user's key, no key or a wrong one do not."""
    url, _, _ = haproxy_door
    path = f"{url}{FRONT_DOOR_METRICS_PATH}"
    metrics = requests.get(path, headers={"Authorization": f"Bearer {KEY}"})
    assert metrics.status_code == 200 and 'haproxy_server_status{proxy="engines",server="spark-a"' in metrics.text
    assert requests.get(path, headers={"Authorization": f"Bearer {ALICE}"}).status_code == 404
    assert requests.get(path).status_code == 401
    assert requests.get(path, headers={"Authorization": f"Bearer {KEY}x"}).status_code == 401


def test_a_conversation_stays_on_one_engine(haproxy_door):
    url, engines, _ = haproxy_door
    system = {"role": "system", "content": "You answer briefly. " * 50}
    for conversation in range(6):
        messages = [system, {"role": "user", "content": f"conversation {conversation}"}]
        # the first turn is keyed without its answer (bounded routing: test_door_routing.py): the turns after it
        first = chat(url, ALICE, messages)
        messages += [first.json()["choices"][0]["message"], {"role": "user", "content": "turn"}]
        before = served(engines)
        for turn in range(4):
            reply = chat(url, ALICE, messages)
            assert reply.status_code == 200
            messages += [reply.json()["choices"][0]["message"], {"role": "user", "content": f"turn {turn}"}]
        after = served(engines)
        # the checks add one-token completions on both engines; the conversation's 4 turns land on one
        assert sorted(round(after[n] - before[n]) // 4 for n in engines) == [0, 1]


def test_drain_sends_new_requests_elsewhere_and_ready_brings_it_back(haproxy_door):
    url, engines, runtime = haproxy_door
    runtime("set server engines/spark-a state drain")
    assert fd_runtime.backend_states(runtime("show stat"))["spark-a"]["state"] == "out"
    before = served(engines)
    for n in range(6):
        assert chat(url, ALICE, [{"role": "user", "content": f"question {n}"}]).status_code == 200
    after = served(engines)
    assert after["spark-b"] - before["spark-b"] >= 6
    assert after["spark-a"] - before["spark-a"] <= 2  # health checks only
    runtime("set server engines/spark-a state ready")
    assert fd_runtime.backend_states(runtime("show stat"))["spark-a"]["state"] == "in"
