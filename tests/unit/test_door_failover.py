"""The real HAProxy with the door's generated config in front of three loopback engines (issue 54): twelve
conversations sharing one first message spread (bounded loads), each conversation's turns stay on one engine,
and an engine that stops answering (as `docker pause` leaves it) has its requests ended within seconds of its
mark-down while a request sent after the freeze is answered by another engine."""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from sparkfleet.contract import paths
from sparkfleet.fleet.front_door import runtime as fd_runtime
from sparkfleet.roles import guard as gd
from sparkfleet.roles.front_door import plan as fd_plan

from tests.tiers import needs
from .helpers import admin_command, door_files, start_haproxy, wait_for
from .test_front_door import ALICE, BOB, NAME, plans

NAMES = ("spark-a", "spark-b", "spark-c")
GUARD_WAIT_S = 2  # how long a guard waits for a frozen engine's /metrics (files/sparkfleet-ready.lua METRICS_S)


class Engine:
    """A loopback engine: answers each chat after `delay_s` with its own name as the content; `freeze()` makes it
    stop answering anything (checks included) while its socket still accepts, as a paused container's does."""

    def __init__(self, name: str):
        self.name, self.delay_s, self.frozen, self.served = name, 0.0, threading.Event(), 0
        self.dead: str | None = None  # "503": its guard cannot reach it; "drop": it dies holding each request
        self.lost = 0  # requests (not checks) that reached it dead
        self.thawed = threading.Event()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                # the door's check (its guard's answer, roles/guard.py READY_PATH), or a request
                check = self.path == gd.READY_PATH or body.get("max_tokens") == 1
                if engine.frozen.is_set() and self.path == gd.READY_PATH:
                    # its guard still answers: 503 once its wait for the engine's /metrics ran out
                    time.sleep(GUARD_WAIT_S)
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if engine.frozen.is_set():
                    engine.thawed.wait(120)
                    return
                if engine.dead and not check:
                    engine.lost += 1
                if engine.dead == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if engine.dead == "503":
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if not check:
                    time.sleep(engine.delay_s)
                    engine.served += 1
                answer = json.dumps({"id": "x", "object": "chat.completion", "model": NAME, "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": engine.name}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def freeze(self):
        self.frozen.set()

    def thaw(self):
        self.frozen.clear()
        self.thawed.set()
        self.thawed = threading.Event()

    def close(self):
        self.thaw()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
@needs("haproxy")
def door(tmp_path_factory):
    """The door (bounded routing, the default) on loopback before three Engines: (url, engines, runtime)."""
    tmp = tmp_path_factory.mktemp("door")
    engines = {name: Engine(name) for name in NAMES}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    planned = fd_plan.front_door_plan("spark-a", plans(**{n: {"lan_address": "127.0.0.1"} for n in NAMES}))
    door = fd_plan.FrontDoor(planned.host, planned.settings.model_copy(update={"front_door_port": port}),
                             tuple(fd_plan.Backend(b.name, "127.0.0.1", engines[b.name].port)
                                   for b in planned.backends), planned.api_key)
    moved = {paths.FRONT_DOOR_DIR: str(tmp), paths.FRONT_DOOR_SOCKET: str(tmp / "admin.sock"),
             paths.FRONT_DOOR_STATE_FILE: str(tmp / "state"), f"bind :{port}": f"bind 127.0.0.1:{port}"}
    door_files(door, tmp)
    proc = start_haproxy(door.config(), tmp, moved)
    url, admin = f"http://127.0.0.1:{port}", str(tmp / "admin.sock")

    def runtime(command: str) -> str:
        return admin_command(admin, command)

    try:
        wait_for(lambda: {r["state"] for r in fd_runtime.backend_states(runtime("show stat")).values()} == {"in"})
        yield url, engines, runtime
    finally:
        proc.terminate()
        proc.wait()
        for e in engines.values():
            e.close()


def ask(url: str, messages: list[dict], key: str = ALICE, timeout: float = 30) -> requests.Response:
    return requests.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=timeout,
                         json={"model": NAME, "messages": messages, "max_tokens": 8})


def all_in(runtime) -> bool:
    return {r["state"] for r in fd_runtime.backend_states(runtime("show stat")).values()} == {"in"}


def test_twelve_conversations_with_one_first_message_spread_and_each_keeps_its_engine(door):
    url, engines, runtime = door
    for e in engines.values():
        e.delay_s = 0.5
    system = {"role": "system", "content": "You are the office's assistant. " * 20}
    first = {"role": "user", "content": "Summarise the attached report."}

    def conversation(n: int) -> list[str]:
        messages, where = [system, first], []
        for turn in range(4):
            reply = ask(url, messages, key=(ALICE, BOB)[n % 2])
            assert reply.status_code == 200, reply.text
            where.append(reply.json()["choices"][0]["message"]["content"])
            messages += [{"role": "assistant", "content": f"summary {n}.{turn}"},
                         {"role": "user", "content": f"more, {n}.{turn}"}]
        return where

    try:
        with ThreadPoolExecutor(12) as pool:
            runs = list(pool.map(conversation, range(12)))
    finally:
        for e in engines.values():
            e.delay_s = 0.0
    counts = {name: sum(r.count(name) for r in runs) for name in NAMES}
    assert max(counts.values()) <= 0.6 * 48, counts  # unbounded, one message: all 48 on one engine
    # from its second turn (its first answer in the key) a conversation keeps its engine unless the bound moved it:
    # how many the bound moves depends on the timing (8-11 of 12 kept on an idle machine, 7 seen under CI's other
    # lane), so the floor is what no affinity would give: turns 2-4 on one engine of three by chance, 1 in 9
    stuck = sum(len(set(r[1:])) == 1 for r in runs)
    assert stuck >= 4, runs
    # alone (no load), every turn from the second reaches the same engine: the key holds across turns
    for n in range(3):
        messages, seen = [system, first, {"role": "assistant", "content": f"alone {n}"}], []
        for turn in range(4):
            messages.append({"role": "user", "content": f"and {turn}?"})
            seen.append(ask(url, messages).json()["choices"][0]["message"]["content"])
            messages.append({"role": "assistant", "content": "ok"})
        assert len(set(seen)) == 1, seen


def test_a_frozen_engine_ends_what_it_holds_within_seconds_and_later_requests_go_elsewhere(door):
    url, engines, runtime = door
    assert all_in(runtime)
    # the engine this conversation's key maps to
    messages = [{"role": "user", "content": "which engine is mine?"}]
    victim = ask(url, messages).json()["choices"][0]["message"]["content"]
    engines[victim].delay_s = 60.0  # the request in flight at the freeze: a long answer, then frozen
    held: dict = {}

    def in_flight():
        started = time.monotonic()
        try:
            reply = ask(url, messages, timeout=60)
            held["status"] = reply.status_code
            held["by"] = reply.json()["choices"][0]["message"]["content"] if reply.status_code == 200 else None
        except requests.RequestException as exc:
            held["status"] = type(exc).__name__
        held["s"] = time.monotonic() - started

    thread = threading.Thread(target=in_flight)
    thread.start()
    time.sleep(0.5)
    frozen_at = time.monotonic()
    engines[victim].freeze()
    try:
        # a request sent right after the freeze, to the same key: answered by another engine within seconds
        started = time.monotonic()
        after = ask(url, messages, timeout=30)
        waited = time.monotonic() - started
        assert after.status_code == 200 and after.json()["choices"][0]["message"]["content"] != victim
        assert waited < 8, waited
        thread.join(30)
        # the request it held ended at its mark-down (checks: ~5 s), not at the answer's 60 s nor a client's
        # timeout, and as no byte of it had gone back, the door sent it to another engine (on-marked-down
        # shutdown-sessions, then retry-on and redispatch): answered, by another
        assert not thread.is_alive() and held["s"] - 0.5 < 8, held
        assert held["status"] == 200 and held["by"] not in (None, victim), held
        state = fd_runtime.backend_states(runtime("show stat"))[victim]
        assert state["state"] != "in", state
        assert time.monotonic() - frozen_at < 15
    finally:
        engines[victim].delay_s = 0.0
        engines[victim].thaw()
    wait_for(lambda: all_in(runtime), 20)


@pytest.mark.parametrize("death", ["503", "drop"])
def test_a_dead_engine_fails_no_plain_request_of_a_client_without_retries(door, death):
    """Killed under load: its guard answers 503 (nothing reached it) or it dies holding the request (no answer):
    the door sends each to another engine, before and after the mark-down; the client never retries."""
    url, engines, runtime = door
    wait_for(lambda: all_in(runtime), 20)
    engines["spark-b"].dead, engines["spark-b"].lost = death, 0
    try:
        with ThreadPoolExecutor(4) as pool:
            replies = list(pool.map(lambda n: ask(url, [{"role": "user", "content": f"plain {n}"}],
                                                  key=(ALICE, BOB)[n % 2], timeout=30), range(40)))
        assert engines["spark-b"].lost > 0  # some reached it before its mark-down
        assert [r.status_code for r in replies] == [200] * 40
        assert all(r.json()["choices"][0]["message"]["content"] != "spark-b" for r in replies)
    finally:
        engines["spark-b"].dead = None
    wait_for(lambda: all_in(runtime), 20)


def test_a_long_answer_on_a_healthy_engine_is_untouched(door):
    """No false mark-down: an answer that takes longer than the door needs to mark a frozen engine down (~5 s)
    comes back whole from its engine, which stays in (its checks answer meanwhile); nothing times it out short of
    the 15-minute inactivity timeout."""
    url, engines, runtime = door
    wait_for(lambda: all_in(runtime), 20)
    messages = [{"role": "user", "content": "a long answer, please"}]
    where = ask(url, messages).json()["choices"][0]["message"]["content"]
    engines[where].delay_s = 8.0
    try:
        started = time.monotonic()
        reply = ask(url, messages, timeout=30)
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == where
        assert time.monotonic() - started >= 8.0
        assert all_in(runtime)
    finally:
        engines[where].delay_s = 0.0
