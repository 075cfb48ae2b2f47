"""The stand-in vLLM server (sim/engine/standin_vllm.py), run as a process."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import openai
import pytest
import requests

from tests.conftest import free_port

from tests.unit.helpers import KEY, Server, make_model, run_to_exit

NAME = "sim-qwen"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}},
                   "required": ["city"]}}}]


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


def test_after_a_tool_result_auto_answers_in_words(server):
    """As a model does: an agent's loop (Open WebUI's built-in tools) ends once the tool answered."""
    first = server.client().chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "weather in Paris?"}], tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    messages = [{"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    r = server.client().chat.completions.create(model=NAME, messages=messages, tools=TOOLS, max_tokens=4)
    assert r.choices[0].finish_reason == "length" and not r.choices[0].message.tool_calls  # words, up to max_tokens


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


# --- fault knobs: the knob file is re-read on every request, so faults come and go without a restart

class Request(threading.Thread):
    """One request in the background: `reply` is set once the stand-in answers."""

    def __init__(self, method, url, **kwargs):
        super().__init__(daemon=True)
        self.method, self.url, self.kwargs, self.reply = method, url, kwargs, None
        self.start()

    def run(self):
        self.reply = requests.request(self.method, self.url, **self.kwargs)


def chat_request(server):
    return Request("POST", server.base + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": NAME, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]})


@pytest.fixture()
def knob_server(model_dir, tmp_path):
    knobs = tmp_path / "engine.json"
    s = Server(model_dir, "--served-model-name", NAME, "--api-key", KEY, SIM_KNOB_FILE=str(knobs))
    yield s, knobs
    knobs.write_text("{}")
    s.stop()


# A held request re-reads the knob file every 0.5 s (standin_vllm.py's wait_while_faulty); unheld, the stand-in
# answers on loopback within milliseconds. The window in which "no answer" is asserted: two of those re-reads.
HELD_WINDOW_S = 2 * 0.5


def test_hang_knob_holds_every_request_until_cleared(knob_server):
    server, knobs = knob_server
    knobs.write_text('{"fault": "hang"}')
    health, chat = Request("GET", server.base + "/health"), chat_request(server)
    time.sleep(HELD_WINDOW_S)
    assert (health.reply, chat.reply) == (None, None)  # port open, nothing answers
    knobs.write_text('{"fault": null}')
    health.join(5), chat.join(5)
    assert (health.reply.status_code, chat.reply.status_code) == (200, 200)


def test_generation_hang_knob_keeps_health_ok(knob_server):
    server, knobs = knob_server
    knobs.write_text('{"fault": "generation-hang"}')
    chat = chat_request(server)
    assert requests.get(server.base + "/health").status_code == 200
    assert requests.get(server.base + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    time.sleep(HELD_WINDOW_S)
    assert chat.reply is None
    knobs.write_text("{}")
    chat.join(5)
    assert chat.reply.json()["usage"]["completion_tokens"] == 1


def test_crash_on_start_knob_exits_1(model_dir, tmp_path):
    knobs = tmp_path / "engine.json"
    knobs.write_text('{"crash_on_start": true}')
    r = run_to_exit(str(model_dir), "--port", str(free_port()), SIM_KNOB_FILE=str(knobs))
    assert r.returncode == 1
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in r.stderr
    r = run_to_exit(str(model_dir), "--port", str(free_port()), SIM_CRASH_ON_START="1")
    assert r.returncode == 1


def test_start_delay_knob_holds_the_port_closed(model_dir, tmp_path):
    knobs = tmp_path / "engine.json"
    knobs.write_text('{"load_delay_s": 1.5}')
    t0 = time.monotonic()
    s = Server(model_dir, SIM_KNOB_FILE=str(knobs))
    try:
        assert time.monotonic() - t0 >= 1.5
    finally:
        s.stop()
