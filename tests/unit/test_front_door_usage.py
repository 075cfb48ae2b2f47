"""Per-user usage and fair share at the front door: the real HAProxy with the generated config and
files/sparkfleet-usage.lua on loopback, in front of a loopback stand-in engine."""

from __future__ import annotations

import json
import socket
import subprocess
import threading

import openai
import pytest
import requests

from sparkfleet import cli
from sparkfleet.contract import monitoring, paths
from sparkfleet.contract.settings import SettingsError, parse_settings
from sparkfleet.roles.front_door import plan as fd_plan
from sparkfleet.fleet import usage, users

from tests.tiers import needs
from .helpers import KEY, SAVED, Server, save, door_files, host_data, make_model, start_haproxy, wait_for
from .test_front_door import NAME, plans

ALICE, BOB = "alice-key-0123456789abcdef", "bob-key-0123456789abcdef"
CAROL, DAVE = "carol-key-0123456789abcdef", "dave-key-0123456789abcdef"
USERS = {"alice": ALICE, "bob": BOB, "carol": {"key": CAROL, "requests_per_minute": 4},
         "dave": {"key": DAVE, "max_concurrent": 1}}


def door_of(**over) -> fd_plan.FrontDoor:
    return fd_plan.front_door_plan("spark-a", plans(**{"spark-a": {"front_door_users": USERS, **over}}))


def test_limits_come_from_the_user_or_the_fleet_defaults():
    door = door_of(front_door_requests_per_minute=100)
    rows = dict(fd_plan.door_rows(fd_plan.door_summary(door_of())))
    assert rows["limits"] == "carol 4 a minute, dave 1 at once"
    assert door.limits_map() == "alice 100:0\nbob 100:0\ncarol 4:0\ndave 100:1\n"
    assert door_of().limits_map() == "carol 4:0\ndave 0:1\n"
    assert door.users_map() == f"{ALICE} alice\n{BOB} bob\n{CAROL} carol\n{DAVE} dave\n"
    for secret in (ALICE, CAROL, KEY):
        assert secret not in door.limits_map() and secret not in door.config()


@pytest.mark.parametrize("users, problem", [
    ({"carol": {"key": CAROL, "requests_per_minute": 0}}, "front_door_users['carol']['requests_per_minute']"),
    ({"carol": {"key": CAROL, "max_concurrent": -1}}, "front_door_users['carol']['max_concurrent']"),
    ({"carol": {"key": CAROL, "burst": 3}}, "front_door_users['carol']['burst']"),
    ({"carol": {"requests_per_minute": 4}}, "front_door_users['carol']['key']"),
    ({"carol": {"key": "short"}}, "front_door_users['carol']['key']"),
])
def test_bad_limits_are_refused_naming_the_user_and_never_the_key(users, problem):
    with pytest.raises(SettingsError) as exc:
        parse_settings("spark-a", host_data(front_door_users=users))
    assert problem in str(exc.value) and CAROL not in str(exc.value)


@pytest.mark.parametrize("name", ['a"b', "a b", "a\nb", "a{b}", "a\\b", "-a", "a,b", "ä"])
def test_a_user_name_that_would_break_the_metrics_or_the_config_is_refused(name):
    with pytest.raises(SettingsError):
        parse_settings("spark-a", host_data(front_door_users={name: ALICE}))


# --- the parser of /usage/metrics: host output, untrusted ------------------------------------------

GOOD = """# HELP sparkfleet_user_requests_total x
# TYPE sparkfleet_user_requests_total counter
sparkfleet_user_requests_total{user="alice",model="Qwen"} 3
sparkfleet_user_requests_total{user="alice",model="_none"} 1
sparkfleet_user_prompt_tokens_total{user="alice",model="Qwen"} 30
sparkfleet_user_bytes_out_total{user="alice"} 900
sparkfleet_user_in_flight{user="b\\"ob"} 1
"""


def test_usage_is_read_per_user_and_model():
    users = usage.parse_usage(GOOD)
    assert users["alice"]["requests"] == 4 and users["alice"]["prompt_tokens"] == 30
    assert users["alice"]["models"]["Qwen"] == {"requests": 3, "errors": 0, "prompt_tokens": 30,
                                                "completion_tokens": 0}
    assert users["alice"]["bytes_out"] == 900 and users['b"ob']["in_flight"] == 1
    both = usage.merged([users, users])
    assert both["alice"]["requests"] == 8 and both["alice"]["models"]["Qwen"]["prompt_tokens"] == 60


@pytest.mark.parametrize("line", [
    'sparkfleet_user_requests_total{user="alice"} 3',  # a per-model name without its model
    'sparkfleet_user_in_flight{user="alice",model="Qwen"} 1',  # a per-user name with one
    'sparkfleet_user_requests_total{user="al"ice",model="Q"} 3',
    'sparkfleet_user_requests_total{user="alice",model="Q"} NaN',
    'sparkfleet_user_requests_total{user="alice",model="Q"} -1',
    'sparkfleet_user_requests_total{user="alice",model="Q"} 1e999',
    'other_metric{user="alice"} 1',
    'sparkfleet_user_requests_total{user="\x1b[31m",model="Q"} 1',
    'sparkfleet_user_requests_total{user="' + "a" * 300 + '",model="Q"} 1',
    "[red]alice[/] 1",
])
def test_a_usage_answer_that_the_lua_file_would_not_write_is_refused(line):
    with pytest.raises(usage.UsageError):
        usage.parse_usage(GOOD + line + "\n")


def test_an_answer_too_long_is_refused():
    with pytest.raises(usage.UsageError):
        usage.parse_usage("# HELP x\n" * (usage.MAX_BYTES // 8))


# --- HAProxy itself, on loopback -------------------------------------------------------------------

@pytest.fixture(scope="module")
@needs("haproxy")
def door(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("usage")
    engine = Server(make_model(tmp / "model"), "--served-model-name", NAME, "--api-key", KEY,
                    SIM_TOKENS_PER_S="200", SIM_FIRST_TOKEN_DELAY_MS="5")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    planned = door_of(lan_address="127.0.0.1")
    planned = fd_plan.FrontDoor(planned.host, planned.settings.model_copy(update={"front_door_port": port}),
                           (fd_plan.Backend("spark-a", "127.0.0.1", engine.port),), planned.api_key)
    door_files(planned, tmp)
    moved = {paths.FRONT_DOOR_DIR: str(tmp), paths.FRONT_DOOR_SOCKET: str(tmp / "admin.sock"),
             paths.FRONT_DOOR_STATE_FILE: str(tmp / "state"), f"bind :{port}": f"bind 127.0.0.1:{port}",
             paths.FRONT_DOOR_USAGE_SNAPSHOT: str(tmp / "usage.snapshot")}
    url = f"http://127.0.0.1:{port}"
    SAVED[url] = (str(tmp / "admin.sock"), str(tmp / "usage.snapshot"))
    procs = [start_haproxy(planned.config(), tmp, moved)]

    def restart():
        """The door stopped as its unit stops it (the snapshot first) and started again."""
        save(url)
        procs[0].terminate()
        procs[0].wait()
        procs[0] = start_haproxy(planned.config(), tmp, moved)
        wait_for(lambda: requests.get(f"{url}/health").status_code == 200)

    RESTART[url] = restart
    try:
        wait_for(lambda: requests.get(f"{url}/health").status_code == 200)
        yield url
    finally:
        procs[0].terminate()
        procs[0].wait()
        engine.stop()


RESTART: dict = {}


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)


def scrape(url: str) -> str:
    """/usage/metrics once the door's counts are saved (it reports what it saved: a restart never loses it)."""
    save(url)
    answer = requests.get(url + monitoring.USAGE_METRICS_PATH, headers={"Authorization": f"Bearer {KEY}"}, timeout=5)
    assert answer.status_code == 200
    return answer.text


def chat(url: str, key: str, content: str = "hello", **extra):
    return client(url, key).chat.completions.create(model=NAME, messages=[{"role": "user", "content": content}],
                                                    **{"max_tokens": 4, **extra})


def test_usage_is_counted_per_user_and_model_with_the_engines_tokens(door):
    replies = [chat(door, ALICE, f"question {n}") for n in range(3)]
    stream = list(chat(door, BOB, "a stream", stream=True))
    assert stream and client(door, BOB).models.list().data[0].id == NAME
    with pytest.raises(openai.BadRequestError):  # the engine's own 400: max_tokens past the model's length
        chat(door, ALICE, "too long", max_tokens=10 ** 6)
    answer = requests.post(f"{door}/v1/chat/completions", headers={"Authorization": f"Bearer {ALICE}"},
                           json={"model": 'x"}\n{evil', "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 404  # no such model on the engine: counted under _other, as an error
    users = usage.parse_usage(scrape(door))  # the first test on this front door: its counts start at 0
    alice, bob = users["alice"], users["bob"]
    assert alice["models"][NAME]["requests"] == 4 and alice["models"][NAME]["errors"] == 1
    assert alice["models"][NAME]["prompt_tokens"] == sum(r.usage.prompt_tokens for r in replies) > 0
    assert alice["models"][NAME]["completion_tokens"] == sum(r.usage.completion_tokens for r in replies) > 0
    assert alice["models"][monitoring.USAGE_OTHER_MODEL] == {"requests": 1, "errors": 1, "prompt_tokens": 0,
                                                             "completion_tokens": 0}
    assert bob["models"][NAME]["requests"] == 1 and bob["models"][NAME]["completion_tokens"] == 0  # a stream
    assert bob["models"][monitoring.USAGE_NO_MODEL]["requests"] == 1  # GET /v1/models
    assert alice["bytes_in"] > 0 and alice["bytes_out"] > bob["bytes_out"] > 0
    assert alice["in_flight"] == 0 and alice["limited"] == 0


def test_the_usage_answer_carries_the_contracts_names(door):
    """What HAProxy's Lua answers at /usage/metrics: every series the contract names and no other (the per-user ones
    read from the contract's stick table, USAGE_TABLE, which the door's config declares), a request without a model
    and one for a model the door does not serve under the contract's two labels."""
    assert f"backend {monitoring.USAGE_TABLE}\n" in door_of().config()
    assert f"str({monitoring.USAGE_OTHER_MODEL})" in door_of().config()
    header = {"Authorization": f"Bearer {DAVE}"}  # no test counts dave's requests; one at a time is his limit
    assert requests.get(f"{door}/v1/models", headers=header, timeout=5).status_code == 200
    unknown = requests.post(f"{door}/v1/chat/completions", headers=header, timeout=30,
                            json={"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]})
    assert unknown.status_code == 404
    text = scrape(door)
    lines = [line for line in text.splitlines() if line]
    series = {line.split("{")[0] for line in lines if not line.startswith("#")}
    typed = {line.split()[2] for line in lines if line.startswith("# TYPE ")}
    assert series == typed == set(monitoring.USAGE_METRICS)
    dave = usage.parse_usage(text)["dave"]
    assert dave["models"][monitoring.USAGE_NO_MODEL]["requests"] == 1
    assert dave["models"][monitoring.USAGE_OTHER_MODEL]["requests"] == 1
    assert dave["bytes_in"] > 0 and dave["bytes_out"] > 0  # the stick table's fields, by user name


def test_usage_answers_only_the_backend_key_and_holds_no_key(door):
    chat(door, ALICE)
    text = scrape(door)
    for secret in (ALICE, BOB, CAROL, DAVE, KEY):
        assert secret not in text
    assert 'user="alice"' in text
    for header in ({}, {"Authorization": f"Bearer {ALICE}"}, {"Authorization": f"Bearer {KEY}x"},
                   {"Authorization": f"Bearer {KEY[:-1]}"}, {"Authorization": KEY},
                   {"Authorization": f"Bearer {KEY}, Bearer {KEY}"}):
        refused = requests.get(door + monitoring.USAGE_METRICS_PATH, headers=header, timeout=5)
        assert refused.status_code == 401 and "sparkfleet_user" not in refused.text


def test_the_fifth_request_within_a_minute_is_refused_while_others_are_served(door):
    for n in range(4):
        chat(door, CAROL, f"question {n}")
    refused = requests.post(f"{door}/v1/chat/completions", headers={"Authorization": f"Bearer {CAROL}"},
                            json={"model": NAME, "messages": [{"role": "user", "content": "fifth"}], "max_tokens": 4})
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "60"
    assert refused.json()["error"]["type"] == "RateLimitError"
    with pytest.raises(openai.RateLimitError):
        chat(door, CAROL, "sixth")
    assert chat(door, ALICE, "still served").choices[0].message.content
    carol = usage.parse_usage(scrape(door))["carol"]
    assert carol["limited"] == 2 and carol["requests"] == 4  # the refused ones reached no engine


def test_a_second_request_at_once_is_refused_with_retry_after_one(door):
    slow = threading.Thread(target=lambda: chat(door, DAVE, "a long one", max_tokens=300))
    slow.start()
    try:
        wait_for(lambda: usage.parse_usage(scrape(door)).get("dave", {}).get("in_flight") == 1, 5)
        refused = requests.post(f"{door}/v1/chat/completions", headers={"Authorization": f"Bearer {DAVE}"},
                                json={"model": NAME, "messages": [{"role": "user", "content": "x"}], "max_tokens": 4})
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
        assert chat(door, BOB, "served meanwhile").choices[0].message.content
    finally:
        slow.join(30)
    # in_flight is the stick table's conn_cur, the very counter the one-at-a-time rule compares: 0 is the condition
    wait_for(lambda: usage.parse_usage(scrape(door))["dave"]["in_flight"] == 0, 5)
    assert chat(door, DAVE, "one at a time again").choices[0].message.content


# --- the commands: `sparkfleet usage` against that front door, `sparkfleet users limit` -------------

def inventory_of(tmp_path, url: str, key: str = KEY) -> str:
    path = tmp_path / "inventory.py"
    path.write_text(f"sparks = [('spark-a', {{'ssh_hostname': '127.0.0.1', 'api_host': '0.0.0.0', 'api_key': {key!r}, "
                    f"'front_door_allow_http': True, 'backend_key_in_clear': True, "
                    f"'controller_front_door_url': {url!r}}})]\n"
                    "front_door = sparks\n")
    return str(path)


def test_the_usage_command_reads_the_front_door(door, tmp_path, capsys):
    chat(door, ALICE, "for the table")
    assert cli.main(["usage", inventory_of(tmp_path, door), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["doors"] == [{"host": "spark-a", "url": door, "ok": True, "problem": None}]
    assert found["users"]["alice"]["models"][NAME]["requests"] >= 1
    assert found["users"]["alice"]["prompt_tokens"] > 0
    assert cli.main(["usage", inventory_of(tmp_path, door)]) == 0
    out = capsys.readouterr().out
    assert "alice" in out and NAME in out and ALICE not in out


def test_the_usage_command_says_what_failed(door, tmp_path, capsys):
    assert cli.main(["usage", inventory_of(tmp_path, door, key="not-the-engines-key")]) == 1
    assert "HTTP 401" in capsys.readouterr().out
    assert cli.main(["usage", inventory_of(tmp_path, door), "--since", "1h"]) == 2
    assert "--since is not read by this sparkfleet yet" in capsys.readouterr().err
    (tmp_path / "none.py").write_text("sparks = [('spark-a', {'ssh_hostname': '127.0.0.1'})]\n")
    assert cli.main(["usage", str(tmp_path / "none.py")]) == 2
    assert "no `front_door` group" in capsys.readouterr().err


def test_users_limit_edits_the_secrets_file_and_keeps_the_key(tmp_path, capsys):
    secrets = tmp_path / "keys.json"
    users.write_secrets(secrets, {"api_key": KEY, "users": {"carol": CAROL, "bob": BOB}})
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"SPARKFLEET_SECRETS = {str(secrets)!r}\nsparks = []\n")
    assert cli.main(["users", "limit", str(inventory), "carol", "--requests-per-minute", "4"]) == 0
    doc = users.read_secrets(secrets)
    assert doc["users"] == {"carol": {"key": CAROL, "requests_per_minute": 4}, "bob": BOB}
    assert CAROL not in capsys.readouterr().err
    assert cli.main(["users", "limit", str(inventory), "carol", "--max-concurrent", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"user": "carol", "action": "limit", "requests_per_minute": 4,
                                                   "max_concurrent": 2}
    s = parse_settings("spark-a", host_data(front_door_users=users.read_secrets(secrets)["users"]))
    assert s.front_door_limits()["carol"] == (4, 2) and s.front_door_keys["carol"] == CAROL
    new, key = users.rotate(users.read_secrets(secrets), "carol")
    assert new["users"]["carol"] == {"key": key, "requests_per_minute": 4, "max_concurrent": 2}
    assert cli.main(["users", "limit", str(inventory), "carol", "--requests-per-minute", "0",
                     "--max-concurrent", "0"]) == 0
    assert users.read_secrets(secrets)["users"]["carol"] == CAROL  # no own limits: a key string again
    assert cli.main(["users", "limit", str(inventory), "nobody", "--max-concurrent", "1"]) == 2
    assert cli.main(["users", "limit", str(inventory), "carol", "--max-concurrent", "-1"]) == 2  # by the parser
    assert users.read_secrets(secrets)["users"]["carol"] == CAROL


@pytest.mark.parametrize("value", [{"key": CAROL, "requests_per_minute": "4"}, {"key": CAROL, "x": 1},
                                   {"requests_per_minute": 4}, {"key": CAROL, "max_concurrent": True}, 5])
def test_a_secrets_file_with_a_malformed_user_is_refused(tmp_path, value):
    secrets = tmp_path / "keys.json"
    users.write_secrets(secrets, {"api_key": KEY, "users": {"carol": value}})
    with pytest.raises(users.SecretsError) as exc:
        users.read_secrets(secrets)
    assert CAROL not in str(exc.value)


def test_a_restarted_door_counts_on_from_its_snapshot(door):
    """A restart (the unit saves the snapshot at a stop) never takes a reported count back: the door starts from
    its snapshot, and what it counts afterwards adds to it."""
    chat(door, ALICE, "before the restart")
    before = usage.parse_usage(scrape(door))["alice"]
    RESTART[door]()
    after = usage.parse_usage(scrape(door))["alice"]
    assert after["models"][NAME] == before["models"][NAME]
    chat(door, ALICE, "after the restart")
    again = usage.parse_usage(scrape(door))["alice"]["models"][NAME]
    assert again["requests"] == before["models"][NAME]["requests"] + 1
    assert again["completion_tokens"] > before["models"][NAME]["completion_tokens"]


def test_what_was_not_saved_is_not_reported(door):
    """Between two snapshots the door reports the last one: a count it could still lose is never shown. (alice chats
    and her count is saved first: under xdist this test may run without the module's others before it.)"""
    chat(door, ALICE, "counted and saved")
    shown = usage.parse_usage(scrape(door))["alice"]["models"][NAME]["requests"]
    chat(door, ALICE, "not saved yet")
    unsaved = requests.get(door + monitoring.USAGE_METRICS_PATH, headers={"Authorization": f"Bearer {KEY}"}, timeout=5)
    assert usage.parse_usage(unsaved.text)["alice"]["models"][NAME]["requests"] == shown
    assert usage.parse_usage(scrape(door))["alice"]["models"][NAME]["requests"] == shown + 1


def test_doors_sharing_the_table_count_its_fields_once_and_their_own_counts_summed():
    """Two doors: each counted the requests it passed (summed); the peers copied the per-user bytes and refusals to
    both (counted once); in flight is each door's own (summed)."""
    one = {"alice": {**usage.empty_user(), "requests": 3, "bytes_in": 900, "limited": 1, "in_flight": 1,
                     "models": {NAME: {**dict.fromkeys(usage.PER_MODEL, 0), "requests": 3}}}}
    two = {"alice": {**usage.empty_user(), "requests": 2, "bytes_in": 900, "limited": 1, "in_flight": 2,
                     "models": {NAME: {**dict.fromkeys(usage.PER_MODEL, 0), "requests": 2}}}}
    shared = usage.merged([one, two], shared_table=True)["alice"]
    assert (shared["requests"], shared["bytes_in"], shared["limited"], shared["in_flight"]) == (5, 900, 1, 3)
    assert shared["models"][NAME]["requests"] == 5
    apart = usage.merged([one, two])["alice"]
    assert (apart["bytes_in"], apart["limited"]) == (1800, 2)
