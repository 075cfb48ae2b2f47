"""The watchdog's and the health gate's probes judge every engine right: llama-server (its /health answers 503
while it loads the model: a start, not a failure; its key, LLAMA_API_KEY in engine.env, guards /metrics too)
and SGLang (/health answers 200 with no body once up, 503 while starting). Fake engines on loopback speak
each engine's endpoints as its source does (llama.cpp tools/server, sglang srt/entrypoints/http_server.py)."""

from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sparkfleet.contract import engines, paths, serving
from sparkfleet.contract.settings import parse_settings
from sparkfleet.contract.shared import envfiles, probes
from sparkfleet.host.serving import EngineMetrics
from tests.unit.helpers import KEY, host_data
from tests.unit.test_watchdog import ANSWERED, CFG, STARTED, UP, quick, wd

LLAMA_METRICS = ("# HELP llamacpp:requests_processing Number of requests processing.\n"
                 "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n"
                 "llamacpp:requests_deferred 0\nllamacpp:tokens_predicted_total 42\n")


class _Engine(BaseHTTPRequestHandler):
    """llama-server or SGLang, by `engine`; `loading` while it loads the model. The key guards every path but
    /health and /v1/models (llama-server's public ones) or /health* and /metrics (SGLang's)."""

    engine = "llamacpp"
    loading = False
    served = "tiny-llama"

    def _open(self) -> bool:
        if self.engine == "sglang":  # started without a key (release/engines/sglang.py): the guard demands it
            return True
        public = ("/health", "/v1/health", "/models", "/v1/models") if self.engine == "llamacpp" else ("/health",
                                                                                                    "/metrics")
        return self.path.startswith(public) or self.headers.get("Authorization") == f"Bearer {KEY}"

    def _send(self, status: int, body: bytes = b"", kind: str = "application/json"):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, value):
        self._send(status, json.dumps(value).encode())

    def do_GET(self):
        if self.path.startswith("/health"):
            if self.engine == "sglang":
                return self._send(503 if self.loading else 200)  # SGLang: a bare status, no body
            if self.loading:
                return self._json(503, {"error": {"code": 503, "message": "Loading model",
                                                  "type": "unavailable_error"}})
            return self._json(200, {"status": "ok"})
        if not self._open():
            return self._json(401, {"error": {"code": 401, "message": "Invalid API Key"}})
        if self.path == "/metrics":
            return self._send(200, LLAMA_METRICS.encode(), "text/plain; version=0.0.4")
        if self.path == "/v1/models":
            return self._json(200, {"object": "list", "data": [{"id": self.served, "object": "model"}]})
        return self._json(404, {"error": "not found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not self._open():
            return self._json(401, {"error": {"code": 401, "message": "Invalid API Key"}})
        if self.loading:
            return self._json(503, {"error": {"code": 503, "message": "Loading model"}})
        assert body["chat_template_kwargs"] == {"enable_thinking": False}  # both engines take it (llama: --jinja)
        self._json(200, {"model": self.served, "choices": [{"index": 0, "message": {"role": "assistant",
                                                                                    "content": "p"}}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})

    def log_message(self, *args):
        pass


@pytest.fixture(params=["llamacpp", "sglang"])
def engine(request, tmp_path, monkeypatch):
    handler = type("Engine", (_Engine,), {"engine": request.param})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(wd, "engine_holds_port", lambda *args: (True, ""))  # no container here
    monkeypatch.setattr(wd, "gpu_check", lambda container: (True, "GPU 0: NVIDIA GB10"))
    env = tmp_path / "engine.env"
    # the key under the engine's own variable (llama-server: LLAMA_API_KEY; SGLang reads none), which the serving
    # file names (contract/engines.py key_var)
    var = engines.descriptor(request.param).key_var
    env.write_text("# Managed by sparkfleet\n" + (f"{var}={KEY}\n" if var else ""))
    cfg = {**quick(CFG, 2), "port": server.server_address[1], "served_name": "tiny-llama", "env_file": str(env),
           "container": "c", "api_key_var": var}
    yield handler, cfg
    server.shutdown()


def test_a_loaded_engine_serves(engine):
    _, cfg = engine
    result = wd.probe(cfg)
    assert (result["serving"], result["failed"], result["detail"]) == (True, None, ""), result


def test_an_engine_loading_its_model_is_starting_until_start_timeout(engine):
    handler, cfg = engine
    handler.loading = True
    result = wd.probe(cfg)
    assert (result["failed"], result["detail"]) == ("health", "/health: HTTP 503")
    fresh = {**UP, "started": STARTED + 1, "up_s": 100.0}
    action, state = wd.decide(CFG, dict(ANSWERED), fresh, result, 1_000_000.0)
    assert action == "starting" and state.get("answered_start") != STARTED + 1  # not yet loaded: no answer counted
    late = {**fresh, "up_s": CFG["start_timeout_s"] + 1.0}  # still loading after start_timeout_s: it counts
    assert wd.decide(CFG, dict(ANSWERED), late, result, 1_000_000.0)[0] == "failing"


def test_the_key_comes_from_the_engines_own_variable(tmp_path):
    assert envfiles.engine_api_key(envfiles.parse_env(f"LLAMA_API_KEY={KEY}\n")) == KEY
    assert envfiles.engine_api_key(envfiles.parse_env(f"VLLM_API_KEY={KEY}\nX=1\n")) == KEY
    assert envfiles.engine_api_key({"X": "1"}) is None


def test_a_rollback_keeps_no_engines_key_by_name():
    live = f"# Managed\nLLAMA_API_KEY={KEY}\nHF_HUB_OFFLINE=1\n"
    kept = envfiles.env_kept(live, set())
    assert KEY not in kept and "LLAMA_API_KEY" not in kept and "#key HF_HUB_OFFLINE" in kept
    assert f"LLAMA_API_KEY={KEY}" in envfiles.env_restored(kept, live, set())


def test_the_probe_body_is_one_for_every_engine():
    """One chat probe: the served name beside a 1-token request with chat_template_kwargs (vLLM, SGLang and
    llama-server with --jinja all take it; thinking models answer at once)."""
    body = probes.probe_body(serving.REQUESTS["chat"], "tiny-llama")
    assert body["model"] == "tiny-llama" and body["max_tokens"] == 1
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_status_reads_llamacpp_metrics_on_the_host_with_the_key_off_the_command_line(tmp_path):
    handler = type("Engine", (_Engine,), {"engine": "llamacpp"})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = tmp_path / "engine.env"
    env.write_text(f'# Managed\nLLAMA_API_KEY={KEY}\n')
    names = ("llamacpp:requests_processing", "llamacpp:requests_deferred")
    try:
        command = EngineMetrics().command(port=server.server_address[1], names=names, key_var="LLAMA_API_KEY")
        assert KEY not in command and paths.ENGINE_ENV in command
        run = subprocess.run(["bash", "-c", command.replace(paths.ENGINE_ENV, str(env))], capture_output=True,
                             text=True, timeout=20)
        assert run.stdout.split() == ["llamacpp:requests_processing", "1", "llamacpp:requests_deferred", "0"]
        unkeyed = EngineMetrics().command(port=server.server_address[1], names=names)
        assert subprocess.run(["bash", "-c", unkeyed], capture_output=True, text=True, timeout=20).stdout == ""
        env.write_text('LLAMA_API_KEY=a"b\\c\n')  # quoted as curl's config string: no line of its own
        run = subprocess.run(["bash", "-c", command.replace(paths.ENGINE_ENV, str(env))], capture_output=True,
                             text=True, timeout=20)
        assert run.stdout == "" and run.returncode == 0  # a wrong key: 401, nothing read, no failure
    finally:
        server.shutdown()


def test_status_asks_llamacpp_metrics_with_the_key(monkeypatch):
    from sparkfleet.fleet import status

    asked = {}

    class Host:
        def get_fact(self, fact, **kw):
            asked[fact.__name__] = kw
            return {"serving": True} if fact.__name__ == "ServiceProbe" else "llamacpp:requests_processing 2\n"

    s = parse_settings("spark-3", host_data(engine="llamacpp"))
    found = status.engine_on_host(Host(), s)
    assert asked["EngineMetrics"]["key_var"] == "LLAMA_API_KEY"
    assert found["metrics"] == {"llamacpp:requests_processing": 2.0}
    status.engine_on_host(Host(), parse_settings("spark-1", host_data()))
    assert "key_var" not in asked["EngineMetrics"]
