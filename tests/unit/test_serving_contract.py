"""One definition of serving (sparkfleet/contract/serving.py): the serving file the converge writes is the
contract as JSON, and the health gate, the watchdog, the front door's check and `status` all ask what it
says; a helper without a sound serving file stops with one line instead of falling back to a copy."""

from __future__ import annotations

import base64
import importlib.machinery
import importlib.util
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sparkfleet.contract import serving
from sparkfleet.contract.settings import parse_settings
from sparkfleet.contract.shared import probes
from tests.unit.helpers import KEY, Server, host_data, make_model
from tests.unit.test_watchdog import wd

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = parse_settings("spark-1", host_data())


def load_health():
    loader = importlib.machinery.SourceFileLoader("sparkfleet_health", str(ROOT / "files" / "sparkfleet-health"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


health = load_health()


class Recorder:
    """A loopback engine that answers any probe and records (method, path, body); `delay_s` holds each POST."""

    def __init__(self, delay_s: float = 0.0):
        self.seen, self.delay_s = [], delay_s
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self, reply):
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                recorder.seen.append(("GET", self.path, None))
                self.answer({"data": [{"id": "sim-qwen"}]} if self.path.startswith("/v1/") else {})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                recorder.seen.append(("POST", self.path, body))
                time.sleep(recorder.delay_s)
                self.answer({"choices": [{"message": {"content": "pong"}}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def posts(self):
        return [(path, body) for method, path, body in self.seen if method == "POST"]

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder():
    engine = Recorder()
    yield engine
    engine.stop()


def write_serving(path: Path, **overrides) -> Path:
    path.write_text(json.dumps({**json.loads(serving.serving_file(SETTINGS)), **overrides}))
    return path


def run_health(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    """sparkfleet-health's main() in this process: the engine's port owner taken as proven (no container here)."""
    monkeypatch.setattr(health, "engine_holds_port", lambda *a: (True, ""))
    monkeypatch.setattr(sys, "argv", ["sparkfleet-health", *args])
    try:
        rc = health.main()
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (print(exc.code, file=sys.stderr) or 1)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_the_serving_file_is_the_contract_and_the_settings():
    written = json.loads(serving.serving_file(SETTINGS))
    assert written == {**serving.watchdog_config(SETTINGS), "probes": serving.probes()}
    assert set(serving.KINDS) <= set(written["probes"]) and {"health", "models", "tool_call"} <= set(written["probes"])
    assert all(probe["answer"] in probes.ANSWERS for probe in written["probes"].values())
    # the watchdog reads every key written, no more (a host with services: each one's keys too)
    service = serving.watchdog_service("embed", "embedding", "E", 8001)
    assert set(wd.KEYS) | set(wd.OPTIONAL_KEYS) == set(serving.watchdog_config(SETTINGS, [service]))
    assert set(wd.SERVICE_KEYS) | set(wd.SERVICE_OPTIONAL_KEYS) == set(service)
    assert "services" not in serving.watchdog_config(SETTINGS)  # a single model's file stays as it was


def test_one_changed_probe_changes_every_asker(recorder, tmp_path, monkeypatch, capsys):
    """The chat probe's path and body changed in the contract alone: the gate, the watchdog, the front door's
    check and status all ask the new one."""
    changed = {**serving.REQUESTS["chat"], "path": "/v1/probe-here", "body": {**serving.REQUESTS["chat"]["body"],
                                                                              "max_tokens": 2}}
    monkeypatch.setitem(serving.REQUESTS, "chat", changed)
    config = write_serving(tmp_path / "serving.json", port=recorder.port, served_name="sim-qwen",
                           env_file=str(tmp_path / "none.env"), container="no-such-container")
    want = ("/v1/probe-here", {"model": "sim-qwen", **changed["body"]})

    rc, out, err = run_health(monkeypatch, capsys, "--serving", str(config), "--port", str(recorder.port),
                              "--served-name", "sim-qwen", "--container", "vllm", "--timeout", "5",
                              "--env-file", "/dev/null")
    assert rc == 0 and json.loads(out)["chat"] == "pong", err
    assert recorder.posts() == [want] and recorder.seen[0][:2] == ("GET", "/health")

    recorder.seen.clear()
    monkeypatch.setattr(wd, "engine_holds_port", lambda *a: (True, ""))
    result = wd.probe(wd.load_config(config))
    assert (result["serving"], result["failed"]) == (True, None) and recorder.posts() == [want]

    from sparkfleet.roles.front_door import plan as fd_plan

    assert fd_plan.Route("model_0", "sim-qwen", "chat", ()).check == (
        "POST", "/v1/probe-here", json.dumps(want[1], separators=(",", ":")))
    # the door's check asks each host's guard, which sends the probe (roles/guard.py ready_check)
    from sparkfleet.roles import guard as gd

    check = gd.ready_check("vllm", "sim-qwen", None)
    assert check["path"] == "/v1/probe-here"
    assert base64.b64decode(check["probe"]).decode() == json.dumps(want[1], separators=(",", ":"))

    from sparkfleet.fleet.status import host_status

    recorder.seen.clear()
    s = parse_settings("spark-1", host_data(served_model_name="sim-qwen", controller_api_url=recorder.base))
    row = host_status("spark-1", s, {})
    assert (row["healthy"], row["error"], row["served"]) == (True, None, ["sim-qwen"])
    assert [p for m, p, _ in recorder.seen] == ["/health", "/v1/models", "/metrics", "/v1/probe-here"]


def test_a_probe_timeout_in_the_contract_is_the_watchdogs(tmp_path, monkeypatch):
    slow = Recorder(delay_s=0.6)
    try:
        monkeypatch.setattr(wd, "engine_holds_port", lambda *a: (True, ""))
        for timeout_s, serving_now in ((0.2, False), (3, True)):
            monkeypatch.setitem(serving.REQUESTS, "chat", {**serving.REQUESTS["chat"], "timeout_s": timeout_s})
            config = write_serving(tmp_path / "serving.json", port=slow.port, served_name="sim-qwen",
                                   env_file=str(tmp_path / "none.env"), container="no-such-container")
            result = wd.probe(wd.load_config(config))
            assert result["serving"] is serving_now, result
        assert result["failed"] is None
    finally:
        slow.stop()


def test_the_gate_judges_a_real_engine_by_the_contract(tmp_path, monkeypatch, capsys):
    """The stand-in engine (vLLM's routes and checks) passes the whole gate: models, chat, a tool call."""
    engine = Server(make_model(tmp_path / "model"), "--served-model-name", "sim-qwen", "--api-key", KEY,
                    "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder")  # the checkpoint's (Qwen3.5)
    try:
        (tmp_path / "engine.env").write_text(f"VLLM_API_KEY={KEY}\n")
        config = write_serving(tmp_path / "serving.json")
        common = ["--serving", str(config), "--port", str(engine.port), "--served-name", "sim-qwen",
                  "--container", "vllm", "--env-file", str(tmp_path / "engine.env")]
        rc, out, err = run_health(monkeypatch, capsys, *common, "--timeout", "10", "--tools")
        report = json.loads(out)
        assert rc == 0 and report["models"] == ["sim-qwen"] and report["tool_call"] == "get_weather", err
        assert report["usage"]["completion_tokens"] >= 1 and report["chat"]
        (tmp_path / "engine.env").write_text("VLLM_API_KEY=wrong\n")
        rc, out, err = run_health(monkeypatch, capsys, *common, "--once")
        assert (rc, err.strip()) == (1, "health: /v1/models: HTTP 401")
    finally:
        engine.stop()


@pytest.mark.parametrize("text, problem", [
    (None, "cannot read it"),
    ("{not json", "is not JSON"),
    ("{}", 'holds no "probes" object'),
    ("drop:interval_s", "lacks interval_s"),
    ("drop-probe:health", "lacks probes.health"),
    ("bad-probe:chat", "probe 'chat' lacks a positive timeout_s and gate_timeout_s"),
])
def test_the_helpers_stop_on_a_missing_or_malformed_serving_file(tmp_path, text, problem):
    path = tmp_path / "serving.json"
    good = json.loads(serving.serving_file(SETTINGS))
    if text and text.startswith("drop:"):
        text = json.dumps({k: v for k, v in good.items() if k != text[5:]})
    elif text and text.startswith("drop-probe:"):
        text = json.dumps({**good, "probes": {k: v for k, v in good["probes"].items() if k != text[11:]}})
    elif text and text.startswith("bad-probe:"):
        name = text[10:]
        text = json.dumps({**good, "probes": {**good["probes"], name: {**good["probes"][name], "timeout_s": -1}}})
    if text is not None:
        path.write_text(text)
    watchdog = subprocess.run([sys.executable, str(ROOT / "files" / "sparkfleet-watchdog"), "--config", str(path),
                               "--check"], capture_output=True, text=True, timeout=30,
                              env={"PYTHONPATH": str(ROOT / "files")})
    assert watchdog.returncode == 2 and watchdog.stdout == "", watchdog.stderr
    line, = watchdog.stderr.splitlines()
    assert line.startswith(f"sparkfleet-watchdog: serving file {path}") and problem in line
    assert line.endswith("run a converge, which writes it") or line.endswith("run a converge")
    if not text or "interval_s" not in problem:  # the gate needs no watchdog key
        gate = subprocess.run([sys.executable, str(ROOT / "files" / "sparkfleet-health"), "--serving", str(path),
                               "--port", "9", "--served-name", "m", "--container", "vllm", "--once",
                               "--env-file", "/dev/null"],
                              capture_output=True, text=True, timeout=30, env={"PYTHONPATH": str(ROOT / "files")})
        assert gate.returncode == 2 and len(gate.stderr.splitlines()) == 1 and problem in gate.stderr, gate.stderr


@pytest.mark.parametrize("key", wd.KEYS)
def test_the_watchdog_copies_no_rule_and_no_path(tmp_path, key):
    """Its engine, intervals, failures, restart limits and host paths (env file, state file) are the serving file's:
    without any one of them the watchdog stops, naming it, where a copy of its own would have carried on."""
    good = json.loads(serving.serving_file(SETTINGS))
    assert key in good
    path = tmp_path / "serving.json"
    path.write_text(json.dumps({k: v for k, v in good.items() if k != key}))
    with pytest.raises(wd.ServingFileError, match=f"lacks {key}: run a converge"):
        wd.load_config(path)
    path.write_text(json.dumps(good))
    assert wd.load_config(path)[key] == good[key]  # the whole file: read as written


@pytest.mark.parametrize("field", ["what", "method", "path", "answer", "timeout_s", "gate_timeout_s", "body"])
def test_the_gate_and_the_watchdog_copy_no_probe(tmp_path, monkeypatch, capsys, field):
    """Each probe's request, answer rule and timeouts are the serving file's: the chat probe without any one of
    them, the health gate and the watchdog stop (exit 2, one line) before asking anything."""
    good = json.loads(serving.serving_file(SETTINGS))
    chat = {k: v for k, v in good["probes"]["chat"].items() if k != field}
    assert chat != good["probes"]["chat"]
    path = tmp_path / "serving.json"
    path.write_text(json.dumps({**good, "probes": {**good["probes"], "chat": chat}}))
    rc, out, err = run_health(monkeypatch, capsys, "--serving", str(path), "--port", "9", "--served-name", "m",
                              "--container", "vllm", "--once", "--env-file", "/dev/null")
    assert (rc, out) == (2, "") and len(err.splitlines()) == 1 and "probe 'chat'" in err, err
    with pytest.raises(wd.ServingFileError, match="probe 'chat'"):
        wd.load_config(path)


@pytest.mark.parametrize("left_out", ["--serving", "--env-file", "--timeout"])
def test_the_gate_has_no_default_file_or_wait(tmp_path, monkeypatch, capsys, left_out):
    """The health gate's serving file, env file and wait are the converge's arguments: none left out is made up."""
    path = write_serving(tmp_path / "serving.json")
    given = {"--serving": [str(path)], "--env-file": ["/dev/null"], "--timeout": ["900"]}
    args = [arg for name, values in given.items() if name != left_out for arg in (name, *values)]
    rc, out, err = run_health(monkeypatch, capsys, *args, "--port", "9", "--served-name", "m", "--container", "vllm")
    assert (rc, out) == (2, "") and left_out in err, err
