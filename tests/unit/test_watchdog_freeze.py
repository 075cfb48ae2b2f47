"""A freeze right after a start (issue 35): an engine that answered someone other than the watchdog (the health
gate, the front door, a user) and then froze before the watchdog's next tick is a loaded engine that hangs, not
one still starting: the watchdog restarts it within `failures` ticks instead of waiting out start_timeout_s."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sparkfleet.contract import engines
from sparkfleet.contract.serving import serving_file
from sparkfleet.contract.settings import parse_settings
from tests.unit.helpers import host_data
from tests.unit.test_watchdog import ANSWERED, CFG, HUNG, STARTED, UP, quick, ticks, wd

FRESH = {**UP, "started": STARTED + 1, "up_s": 25.0}  # restarted 25 s ago; the watchdog never saw it answer
# what the probe says of it: /health silent, and the port's listener held by the engine container
FROZEN = {**HUNG, "frozen": True}


def test_a_freeze_after_an_answer_the_watchdog_did_not_see_is_restarted_within_failures_ticks():
    actions, state = ticks([FROZEN] * CFG["failures"], state=ANSWERED, unit=FRESH)
    assert actions == ["failing"] * (CFG["failures"] - 1) + ["restart"]
    assert state["answered_start"] == FRESH["started"] and state["restarts_total"] == 1


def test_an_engine_not_yet_listening_is_still_starting():
    # nothing holds the port (vLLM and SGLang listen only once loaded): the start goes on, as before
    assert ticks([HUNG] * 5, state=ANSWERED, unit=FRESH)[0] == ["starting"] * 5


class _Engine(BaseHTTPRequestHandler):
    mode = "ok"  # ok | loading (llama.cpp: 503 while it loads) | frozen (accepts, never answers)

    def do_GET(self):
        if self.mode == "frozen":
            time.sleep(3)
            return
        body = b'{"status": "ok"}' if self.mode == "ok" else b'{"error": "Loading model"}'
        self.send_response(200 if self.mode == "ok" else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture()
def engine(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    held = {"value": (True, "")}
    monkeypatch.setattr(wd, "engine_holds_port", lambda *args: held["value"])
    monkeypatch.setattr(wd, "gpu_check", lambda container: (None, "not asked"))
    cfg = {**quick(CFG, 0.5), "port": server.server_address[1], "container": "vllm", "env_file": "/nonexistent"}
    yield cfg, held
    _Engine.mode = "ok"
    server.shutdown()


def test_the_probe_names_a_silent_listener_of_the_engine_container_frozen(engine):
    cfg, held = engine
    _Engine.mode = "frozen"
    result = wd.probe(cfg)
    assert (result["failed"], result["frozen"]) == ("health", True), result
    held["value"] = (False, "port 1 is held by process 9 (nc) outside engine container vllm")
    assert wd.probe(cfg)["frozen"] is False  # a squatter's silence says nothing of the engine
    held["value"] = (True, "")
    assert wd.probe({**cfg, "silent_listener_frozen": False})["frozen"] is False  # an engine silent while loading
    _Engine.mode = "loading"
    result = wd.probe(cfg)
    assert (result["detail"], result["frozen"]) == ("/health: HTTP 503", False)  # answered: llama.cpp still loads


def test_nothing_listening_is_no_freeze(engine):
    cfg, held = engine
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    held["value"] = (False, f"nothing listens on 127.0.0.1:{closed}")  # what engine_holds_port finds there
    assert wd.probe({**cfg, "port": closed})["frozen"] is False


def test_every_engine_says_whether_its_silent_listener_is_a_loaded_engine_and_the_serving_file_carries_it():
    assert all(isinstance(d.silent_listener_frozen, bool) for d in engines.DESCRIPTORS.values())
    for name in engines.ENGINES:
        served = json.loads(serving_file(parse_settings("spark-1", host_data(engine=name))))
        assert served["silent_listener_frozen"] is engines.descriptor(name).silent_listener_frozen


def test_an_older_serving_file_without_the_fact_keeps_the_old_rule(tmp_path):
    older = {k: v for k, v in json.loads(serving_file(parse_settings("spark-1", host_data()))).items()
             if k != "silent_listener_frozen"}
    path = tmp_path / "serving.json"
    path.write_text(json.dumps(older))
    assert wd.load_config(path)["silent_listener_frozen"] is False
