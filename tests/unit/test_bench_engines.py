"""`bench` measures any engine: the timings are the client's (streamed OpenAI chunks, as llama-server and SGLang
send them), the engine's own generated-tokens counter is read beside them, and vLLM-only figures (prefix-cache
and speculative counters) read "not exported by <engine>" instead of failing."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from rich.console import Console

from sparkfleet.contract import engines
from sparkfleet.fleet import bench


class _Streaming(BaseHTTPRequestHandler):
    """An engine that streams `max_tokens` tokens, one chunk each, then a usage chunk, and counts them in its
    /metrics under its own names (contract/engines.py)."""

    engine = "llamacpp"
    generated = 0
    lock = threading.Lock()
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path != "/metrics":
            self.send_error(404)
            return
        m = engines.metrics(self.engine)
        lines = [f"{m.running} 0", f"{m.waiting} 0", f"{m.generation_tokens} {type(self).generated}"]
        if self.engine == "sglang":
            lines.append('sglang:cache_hit_rate{model_name="m"} 0.25')
        body = ("\n".join(lines) + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert request["ignore_eos"] is True and request["stream"] is True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(value):
            data = f"data: {value if isinstance(value, str) else json.dumps(value)}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        n = request["max_tokens"]
        for i in range(n):
            time.sleep(0.002)
            send({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": request["model"],
                  "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]})
        with type(self).lock:
            type(self).generated += n
        send({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": request["model"], "choices": [],
              "usage": {"prompt_tokens": 20, "completion_tokens": n, "total_tokens": 20 + n}})
        send("[DONE]")
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args):
        pass


@pytest.fixture(params=["llamacpp", "sglang"])
def server(request):
    handler = type("Engine", (_Streaming,), {"engine": request.param, "generated": 0, "lock": threading.Lock()})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield request.param, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_bench_measures_any_engine_and_names_what_it_does_not_export(server):
    engine, url = server
    result = bench.run_bench(url, "tiny-llama", None, concurrency=[1, 2], max_tokens=8, think=False,
                             requests_per_level=2, roofline=1000.0)
    assert result["engine"] == engine  # told by its /metrics
    assert result["errors"] == 0 and result["single_stream_decode_tokens_per_s"] > 0
    assert result["engine_generation_tokens"] == 2 * 2 * 8  # the engine's counter over the run, warm-up excluded
    assert result["speculative_decoding"] is None and result["prefix_cache"]["not_exported_by"] == engine
    console = Console(record=True, width=200)
    bench.print_table(result, console)
    out = console.export_text()
    assert "single-stream decode:" in out and "tokens/s" in out and "measured / roofline" in out
    assert f"prefix cache: hit counters not exported by {engine}" in out
    assert f"speculative decoding: counters not exported by {engine}" in out
    assert f"{engine} counted 32 tokens generated during the run" in out
    if engine == "sglang":
        assert "its own sglang:cache_hit_rate reads 25.0 % after the run" in out


def test_the_inventory_names_the_engine(server):
    engine, url = server
    told = "sglang" if engine == "llamacpp" else "llamacpp"  # the inventory wins over what /metrics looks like
    result = bench.run_bench(url, "m", None, concurrency=[1], max_tokens=4, think=False, requests_per_level=1,
                             engine=told)
    assert result["engine"] == told and result["prefix_cache"]["not_exported_by"] == told


def test_an_engine_is_told_by_its_metrics_names():
    assert bench.engine_of("vllm:num_requests_running 1\n") == "vllm"
    assert bench.engine_of('sglang:num_running_reqs{model_name="m"} 0\n') == "sglang"
    assert bench.engine_of("llamacpp:requests_processing 0\n") == "llamacpp"
    assert bench.engine_of("") is None and bench.engine_of(None) is None
    assert bench.engine_tokens("llamacpp", "llamacpp:tokens_predicted_total 5\n",
                               "llamacpp:tokens_predicted_total 12\n") == 7
    assert bench.engine_tokens(None, "", "") is None and bench.engine_tokens("vllm", None, "x 1\n") is None
