"""The front door's check of a chat engine, as its guard answers it (issue 54: roles/guard.py READY_PATH,
files/sparkfleet-ready.lua), on Debian's HAProxy with the guard's generated config: a busy engine whose probe waits
its turn behind others is ready while its work moves, an idle one while it answers the chat probe; a frozen one, a
wedged one (requests in flight, nothing moving past the window) and a dead one are not."""

from __future__ import annotations

import base64
import json
import math
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from sparkfleet.contract import paths, serving
from sparkfleet.release.plan import plan_hosts
from sparkfleet.roles import guard as gd
from sparkfleet.roles.front_door import plan as fd_plan

from tests.tiers import needs
from . import helpers
from .helpers import KEY, free_api_port, haproxy_serving, host_data, make_model, wait_for

NAME = "Qwen3.5-35B-A3B"


def ready(url: str, key: str | None = KEY) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return requests.get(url + gd.READY_PATH, headers=headers, timeout=10)


# --- rendered -------------------------------------------------------------------------------------

def test_a_chat_engine_s_check_reads_its_probe_its_series_and_a_window_from_the_planned_context():
    [p] = plan_hosts([("spark-a", host_data(api_key=KEY, max_model_len=4096))], resolve=False)
    [listener] = gd.guard_plan(p).listeners
    method, path, body = serving.http_check("chat", p.settings.served_model_name)
    assert listener.ready is not None
    assert (method, listener.ready["path"], base64.b64decode(listener.ready["probe"]).decode()) == ("POST", path, body)
    assert listener.ready["busy"] == ("vllm:num_requests_running", "vllm:num_requests_waiting")
    assert "vllm:generation_tokens_total" in listener.ready["moves"]
    # 4,096 tokens at 2,000 tokens/s (3 s), and the margin; a context past one step's chunk is one chunk's
    assert listener.ready["window_s"] == 3 + gd.READY_MARGIN_S
    assert gd.ready_window_s(262144) == math.ceil(gd.STEP_TOKENS / gd.PREFILL_TOKENS_PER_S) + gd.READY_MARGIN_S
    config = gd.guard_plan(p).config()
    assert f"lua-load {paths.GUARD_READY_LUA}" in config
    assert "http-request use-service lua.sparkfleet_ready if sf_ready" in config


def test_llama_cpp_s_check_also_watches_its_decode_calls():
    """Its token counters move only when a prompt or an answer ends: a 5-minute stream would look still."""
    check = gd.ready_check("llamacpp", NAME, 4096)
    assert "llamacpp:n_decode_total" in check["moves"]
    assert check["busy"] == ("llamacpp:requests_processing", "llamacpp:requests_deferred")


def test_the_door_asks_each_chat_engine_s_guard_and_no_chat_probe_of_its_own():
    from .test_front_door import plans

    door = fd_plan.front_door_plan("spark-a", plans(**{"spark-a": {}, "spark-b": {}}))
    config = door.config()
    block = config.split(f"\nbackend {fd_plan.BACKEND}\n", 1)[1].split("\nbackend ", 1)[0]
    [send] = [line.strip() for line in block.splitlines() if "http-check send" in line]
    assert send.startswith(f"http-check send meth GET uri {gd.READY_PATH} ver HTTP/1.1 hdr Host front-door ")
    assert "body" not in send and "max_tokens" not in block
    assert f"timeout check {fd_plan.CHECK['timeout']}" in config


# --- Debian's HAProxy on loopback ------------------------------------------------------------------

class FakeEngine:
    """An engine as the guard's check sees it: its /metrics (requests in flight, a token counter that moves while
    `working`), its chat probe (answered after `probe_s`), and `frozen` (nothing answers, as a paused container)."""

    def __init__(self, port: int):
        self.in_flight, self.tokens, self.working, self.probe_s = 0, 0, False, 0.0
        self.frozen = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def answer(self, status: int, body: bytes):
                if fake.frozen.is_set():
                    time.sleep(30)
                    return
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if fake.working:
                    fake.tokens += 7
                self.answer(200, (f'# TYPE vllm:num_requests_running gauge\n'
                                  f'vllm:num_requests_running{{model_name="{NAME}"}} {fake.in_flight}\n'
                                  f'vllm:num_requests_waiting{{model_name="{NAME}"}} 0\n'
                                  f'vllm:generation_tokens_total{{model_name="{NAME}"}} {float(fake.tokens)}\n'
                                  ).encode())

            def do_POST(self):
                json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                time.sleep(fake.probe_s)
                self.answer(200, b'{"choices":[{"message":{"content":"pong"}}]}')

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.frozen.clear()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
@needs("haproxy")
def fake_guarded(tmp_path):
    """The real guard (the planned config, a window of 3 + 2 s) before a FakeEngine: (url, engine)."""
    api_port = free_api_port()
    engine = FakeEngine(paths.engine_port(api_port))
    [p] = plan_hosts([("spark-a", host_data(api_host="127.0.0.1", api_port=api_port, api_key=KEY,
                                            max_model_len=4096))], resolve=False)
    guard = gd.guard_plan(p)
    helpers.guard_files(guard, tmp_path)
    try:
        with haproxy_serving(guard.config(), tmp_path, {paths.GUARD_DIR: str(tmp_path)},
                             f"http://127.0.0.1:{api_port}") as url:
            yield url, engine
    finally:
        engine.close()


@needs("haproxy")
def test_the_check_wants_the_backend_key(fake_guarded):
    url, _ = fake_guarded
    assert ready(url, None).status_code == 401
    assert ready(url, KEY + "x").status_code == 401


@needs("haproxy")
def test_an_idle_engine_is_ready_while_it_answers_the_probe(fake_guarded):
    url, engine = fake_guarded
    r = ready(url)
    assert r.status_code == 200 and r.json()["why"].startswith("idle"), r.text
    engine.probe_s = 3  # past the guard's 1 s bound for an idle engine: a wedged decode
    r = ready(url)
    assert r.status_code == 503 and "chat probe" in r.json()["why"], r.text


@needs("haproxy")
def test_a_busy_engine_whose_probe_waits_is_ready_while_its_work_moves_and_not_once_it_stands_still(fake_guarded):
    url, engine = fake_guarded
    engine.in_flight, engine.working, engine.probe_s = 4, True, 30  # a probe would wait behind the four
    started = time.monotonic()
    while time.monotonic() - started < 7:  # past the window: its work keeps moving
        r = ready(url)
        assert r.status_code == 200 and r.json()["why"].startswith("busy"), r.text
        time.sleep(0.5)
    engine.working = False  # wedged: the four still in flight, nothing moves
    seen: list[requests.Response] = []
    wait_for(lambda: seen.append(ready(url)) or seen[-1].status_code == 503, 15)
    assert seen[-1].json()["why"].startswith("stalled: 4 in flight"), seen[-1].text
    assert len(seen) > 1 and seen[0].status_code == 200  # the window first
    engine.working = True  # it moves again: ready at once
    assert ready(url).status_code == 200


@needs("haproxy")
def test_a_frozen_engine_is_not_ready_within_the_guard_s_wait_for_its_metrics(fake_guarded):
    url, engine = fake_guarded
    engine.in_flight, engine.working = 2, True
    assert ready(url).status_code == 200
    engine.frozen.set()
    started = time.monotonic()
    r = ready(url)
    assert r.status_code == 503 and r.json()["why"].startswith("/metrics: no answer"), r.text
    assert r.reason.startswith("/metrics: no answer")  # what the door's log and `show stat` say of the check
    assert time.monotonic() - started < float(fd_plan.CHECK["timeout"].removesuffix("s"))


@needs("haproxy")
def test_a_dead_engine_is_not_ready(fake_guarded):
    url, engine = fake_guarded
    engine.close()
    r = ready(url)
    assert r.status_code == 503 and "no connection" in r.json()["why"], r.text


@needs("haproxy")
def test_the_stand_in_with_every_slot_taken_is_ready_and_paused_is_not(tmp_path):
    """The stand-in vLLM with one slot, held by a stream: a chat probe waits (the old check's failure), the guard's
    check passes while the stream's tokens move; SIGSTOP (what `docker pause` does) fails it."""
    api_port = free_api_port()
    real = helpers.free_port
    helpers.free_port = lambda: paths.engine_port(api_port)
    try:
        engine = helpers.Server(make_model(tmp_path / "model"), "--served-model-name", NAME, "--api-key", KEY,
                                "--max-num-seqs", "1", SIM_TOKENS_PER_S="20", SIM_FIRST_TOKEN_DELAY_MS="5")
    finally:
        helpers.free_port = real
    [p] = plan_hosts([("spark-a", host_data(api_host="127.0.0.1", api_port=api_port, api_key=KEY))], resolve=False)
    guard = gd.guard_plan(p)
    helpers.guard_files(guard, tmp_path)
    headers = {"Authorization": f"Bearer {KEY}"}
    method, path, body = serving.http_check("chat", NAME)
    try:
        with haproxy_serving(guard.config(), tmp_path, {paths.GUARD_DIR: str(tmp_path)},
                             f"http://127.0.0.1:{api_port}") as url, ThreadPoolExecutor(2) as pool:
            stream = pool.submit(requests.post, url + "/v1/chat/completions", headers=headers, timeout=60,
                                 json={"model": NAME, "messages": [{"role": "user", "content": "go on"}],
                                       "max_tokens": 120, "stream": True})
            wait_for(lambda: any(line.startswith("vllm:num_requests_running{") and line.endswith(" 1.0") for line
                                 in requests.get(url + "/metrics", headers=headers, timeout=5).text.splitlines()))
            with pytest.raises(requests.Timeout):  # the probe waits for the slot
                requests.request(method, url + path, headers=headers, data=body, timeout=1.5)
            for _ in range(6):
                r = ready(url)
                assert r.status_code == 200 and r.json()["why"].startswith("busy"), r.text
                time.sleep(0.5)
            os.kill(engine.proc.pid, signal.SIGSTOP)
            try:
                r = ready(url)
                assert r.status_code == 503 and r.json()["why"].startswith("/metrics"), r.text
            finally:
                os.kill(engine.proc.pid, signal.SIGCONT)
            assert stream.result().status_code == 200
    finally:
        engine.stop()
