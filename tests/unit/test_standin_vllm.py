"""The stand-in vLLM server (sim/engine/standin_vllm.py), run as a process."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "sim" / "engine" / "standin_vllm.py"
FLAGS = ROOT / "sparkfleet" / "release" / "engines" / "vllm-0.33.0.json"
NAME = "sim-qwen"
KEY = "s3cret"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}},
                   "required": ["city"]}}}]


def _write_shard(path: Path, tensors: dict[str, int]) -> None:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, n in tensors.items():
        header[name] = {"dtype": "BF16", "shape": [n], "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\x00" * offset)


def make_model(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "text_config": {"model_type": "qwen3_5_moe_text", "max_position_embeddings": 8192}}))
    shards = {"model-00001-of-00002.safetensors": {"embed.weight": 64, "layer.0.w": 32},
              "model-00002-of-00002.safetensors": {"lm_head.weight": 48}}
    weight_map = {}
    for fname, tensors in shards.items():
        _write_shard(root / fname, tensors)
        weight_map.update({t: fname for t in tensors})
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 288}, "weight_map": weight_map}))
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(**extra) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SIM_", "VLLM_"))}
    e.update({"SIM_LOAD_DELAY_S": "0", "PYTHONUNBUFFERED": "1"}, **extra)
    return e


def run_to_exit(*args, timeout=15, **env_extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(STANDIN), "--flags-file", str(FLAGS), *args],
                          capture_output=True, text=True, timeout=timeout, env=env(**env_extra))


class Server:
    def __init__(self, model: Path, *flags: str, **env_extra):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, str(STANDIN), "--flags-file", str(FLAGS), str(model),
             "--host", "127.0.0.1", "--port", str(self.port), *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env(**env_extra))
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"stand-in exited {self.proc.returncode}: "
                                     f"{self.proc.stdout.read()}")
            try:
                if requests.get(self.base + "/health", timeout=1).status_code == 200:
                    return
            except requests.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise AssertionError("stand-in did not become healthy")

    def client(self, key=KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base + "/v1", api_key=key, max_retries=0, timeout=20)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.stdout.read()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("standin") / "model")


@pytest.fixture(scope="module")
def server(model_dir):
    s = Server(model_dir, "--served-model-name", NAME, "--api-key", KEY,
               "--max-model-len", "4096", "--enable-auto-tool-choice",
               "--tool-call-parser", "qwen3_coder", "--reasoning-parser", "qwen3",
               "--limit-mm-per-prompt", '{"image": 0, "video": 0}',
               "--gpu-memory-utilization=0.8", "--max-num-seqs", "4",
               "--enable-prefix-caching", "--attention-backend", "FLASH_ATTN",
               "--kv-cache-dtype", "auto", "-tp", "1", SIM_TOKENS_PER_S="40")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def plain_server(model_dir):
    s = Server(model_dir, "--served-model-name", NAME)
    yield s
    s.stop()


def test_models_list(server, model_dir):
    models = server.client().models.list()
    assert [m.id for m in models.data] == [NAME]
    raw = requests.get(server.base + "/v1/models",
                       headers={"Authorization": f"Bearer {KEY}"}).json()
    entry = raw["data"][0]
    assert raw["object"] == "list"
    assert entry["owned_by"] == "vllm" and entry["root"] == str(model_dir)
    assert entry["max_model_len"] == 4096


def test_chat_non_stream_with_usage_and_reasoning(server):
    r = server.client().chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "hello there"}], max_tokens=20)
    assert r.choices[0].message.content
    assert r.choices[0].message.model_extra["reasoning"]
    assert r.usage.completion_tokens == 20
    assert r.usage.total_tokens == r.usage.prompt_tokens + 20
    # thinking off: no reasoning, all 5 tokens are answer
    r = server.client().chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.model_extra.get("reasoning") is None
    assert len(r.choices[0].message.content.split()) == 5
    assert r.choices[0].finish_reason == "length"


def test_stream_rate_and_usage(server):
    stream = server.client().chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "count"}], max_tokens=40, stream=True,
        stream_options={"include_usage": True},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    stamps, text, usage, finish = [], [], None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                stamps.append(time.monotonic())
                text.append(choice.delta.content)
            finish = choice.finish_reason or finish
    assert len(stamps) == 40
    assert usage.completion_tokens == 40 and usage.prompt_tokens > 0
    assert finish == "length"
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    assert 36 <= rate <= 44, rate


def test_tool_call_with_auto_tool_choice(server):
    r = server.client().chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "weather in Paris?"}], tools=TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "sim"}


def test_tool_call_without_auto_tool_choice_is_400(plain_server):
    with pytest.raises(openai.BadRequestError) as e:
        plain_server.client().chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "weather?"}], tools=TOOLS,
            tool_choice="auto")
    assert e.value.status_code == 400
    assert ('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
            "to be set") in str(e.value)


def test_api_key_required_on_v1_only(server):
    r = requests.get(server.base + "/v1/models")
    assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}
    with pytest.raises(openai.AuthenticationError):
        server.client(key="wrong").models.list()
    assert requests.get(server.base + "/health").status_code == 200
    assert requests.get(server.base + "/metrics").status_code == 200


def test_wrong_model_name_is_404(server):
    with pytest.raises(openai.NotFoundError) as e:
        server.client().chat.completions.create(
            model="Qwen/Qwen3.5-35B-A3B-FP8", messages=[{"role": "user", "content": "hi"}])
    err = e.value.body
    assert err["type"] == "NotFoundError" and err["code"] == 404 and err["param"] == "model"
    assert err["message"].startswith("The model `Qwen/Qwen3.5-35B-A3B-FP8` does not exist.")


def _metrics(server) -> dict[str, float]:
    out = {}
    for line in requests.get(server.base + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_metrics_move_after_requests(server):
    label = f'{{engine="0",model_name="{NAME}"}}'
    before = _metrics(server)
    prompt = " ".join(f"w{i}" for i in range(40))
    for _ in range(2):
        server.client().chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": prompt}], max_tokens=3,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    after = _metrics(server)
    assert after["vllm:generation_tokens_total" + label] == \
        before["vllm:generation_tokens_total" + label] + 6
    queried = after["vllm:prefix_cache_queries_total" + label] - \
        before["vllm:prefix_cache_queries_total" + label]
    hits = after["vllm:prefix_cache_hits_total" + label] - \
        before["vllm:prefix_cache_hits_total" + label]
    assert queried > 80 and 32 <= hits < queried  # the repeat hit its full blocks
    assert after["vllm:prompt_tokens_total" + label] > before["vllm:prompt_tokens_total" + label]
    assert after["vllm:time_to_first_token_seconds_count" + label] == \
        before["vllm:time_to_first_token_seconds_count" + label] + 2
    assert after["vllm:inter_token_latency_seconds_count" + label] > \
        before["vllm:inter_token_latency_seconds_count" + label]
    assert "vllm:num_requests_running" + label in after
    assert "vllm:num_requests_waiting" + label in after
    assert "vllm:kv_cache_usage_perc" + label in after


def test_unknown_flag_exits_2(model_dir):
    r = run_to_exit(str(model_dir), "--foo")
    assert r.returncode == 2
    assert "vllm: error: unrecognized arguments: --foo" in r.stderr


def test_removed_flags_rejected_but_disable_log_requests_accepted(model_dir):
    r = run_to_exit(str(model_dir), "--enable-reasoning", "--reasoning-parser", "qwen3")
    assert r.returncode == 2
    assert "unrecognized arguments: --enable-reasoning" in r.stderr
    # vLLM 0.33.0 accepts --disable-log-requests as the inverse of
    # --enable-log-requests (see the flag table's notes); so does the stand-in.
    s = Server(model_dir, "--disable-log-requests")
    s.stop()


def test_bad_choice_and_bad_json_exit_2(model_dir):
    r = run_to_exit(str(model_dir), "--dtype", "fp7")
    assert r.returncode == 2 and "argument --dtype: invalid choice: 'fp7'" in r.stderr
    r = run_to_exit(str(model_dir), "--limit-mm-per-prompt", "{image: 0}")
    assert r.returncode == 2 and "--limit-mm-per-prompt" in r.stderr


def test_auto_tool_choice_needs_parser(model_dir):
    r = run_to_exit(str(model_dir), "--enable-auto-tool-choice")
    assert r.returncode == 1
    assert "--enable-auto-tool-choice requires --tool-call-parser" in r.stderr


def test_corrupt_and_missing_shards_refused(model_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    shard = broken / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    r = run_to_exit(str(broken), "--port", str(free_port()))
    assert r.returncode != 0
    assert "model-00002-of-00002.safetensors" in r.stderr
    shard.unlink()
    r = run_to_exit(str(broken), "--port", str(free_port()))
    assert r.returncode != 0
    assert "model-00002-of-00002.safetensors" in r.stderr


def test_max_model_len_above_model_refused(model_dir):
    r = run_to_exit(str(model_dir), "--max-model-len", "16384")
    assert r.returncode == 1
    assert "User-specified max_model_len (16384) is greater than the derived max_model_len" \
        in r.stderr


def test_sigterm_stops_promptly(model_dir):
    s = Server(model_dir)
    t0 = time.monotonic()
    out = s.stop()
    assert s.proc.returncode == 0
    assert time.monotonic() - t0 < 2
    assert "Starting vLLM API server" in out and "Starting vLLM server on" in out
