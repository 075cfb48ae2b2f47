"""The stand-in vLLM's finite prefix cache and prefill time (sim/engine/standin_vllm.py, "Prefix cache and
prefill"): what tools/bench_affinity.py measures routing by, so it must hit, evict and cost time as vLLM's does."""

from __future__ import annotations

import importlib.util
import json
import time

import pytest
import requests

from tests.unit.helpers import KEY, STANDIN, Server, make_model, qwen35_config

NAME = "sim-qwen"
GIB = 2**30


@pytest.fixture(scope="module")
def standin():
    spec = importlib.util.spec_from_file_location("standin_vllm_cache", STANDIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("prefix-cache") / "model")


def serve(model_dir, *flags: str, **env) -> Server:
    return Server(model_dir, "--served-model-name", NAME, "--api-key", KEY, "--max-model-len", "8192",
                  "--enable-prefix-caching", *flags, **{"SIM_TOKENS_PER_S": "200", **env})


def counters(server: Server) -> tuple[float, float]:
    """(queries, hits) of vLLM's prefix-cache counters on the server's /metrics."""
    found = {}
    for line in requests.get(server.base + "/metrics", headers={"Authorization": f"Bearer {KEY}"},
                             timeout=5).text.splitlines():
        name = line.split("{", 1)[0]
        if name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
            found[name] = float(line.rsplit(" ", 1)[1])
    return found["vllm:prefix_cache_queries_total"], found["vllm:prefix_cache_hits_total"]


def ask(server: Server, messages: list, max_tokens: int = 1) -> tuple[float, str, int]:
    """(seconds to the first streamed content, the answer, the prompt's tokens) of one chat, thinking off."""
    started = time.monotonic()
    first, words, usage = None, [], {}
    with requests.post(server.base + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                       stream=True, timeout=30,
                       json={"model": NAME, "messages": messages, "max_tokens": max_tokens, "stream": True,
                             "stream_options": {"include_usage": True},
                             "chat_template_kwargs": {"enable_thinking": False}}) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            delta = chunk["choices"][0]["delta"] if chunk["choices"] else {}
            if delta.get("content"):
                first = first if first is not None else time.monotonic() - started
                words.append(delta["content"])
    return first, "".join(words), usage["prompt_tokens"]


def system(tag: str, words: int) -> dict:
    return {"role": "system", "content": " ".join(f"{tag}{n}" for n in range(words))}


def test_kv_bytes_per_token_and_budget_from_the_flags(standin):
    """Qwen3.5-35B-A3B: 10 full-attention layers x 2 KV heads x 256 x 2 (K, V) x 2 bytes = 20,480 a token (the
    reference's figure), half with an fp8 KV cache; the budget is the share of a 128 GB Spark less the weights and
    the planner's 3 GiB reserve, unless --kv-cache-memory-bytes or --num-gpu-blocks-override says otherwise."""
    config = qwen35_config()
    assert standin.kv_bytes_per_token(config, "auto") == 20480
    assert standin.kv_bytes_per_token(config, "fp8") == 10240
    assert standin.kv_bytes_per_token({"text_config": {}}, None) == standin.FALLBACK_KV_BYTES_PER_TOKEN
    cfg = {"block_size": 16, "gpu_memory_utilization": 0.88, "host_memory_gb": 128.0, "kv_cache_dtype": "auto"}
    assert standin.kv_cache_blocks(cfg, config, 35 * 10**9) == int((128e9 * 0.88 - 35e9 - 3 * GIB) // (16 * 20480))
    assert standin.kv_cache_blocks({**cfg, "kv_cache_memory_bytes": 16 * 20480 * 100}, config, 35 * 10**9) == 100
    assert standin.kv_cache_blocks({**cfg, "num_gpu_blocks_override": 7}, config, 35 * 10**9) == 7
    assert standin.kv_cache_blocks({**cfg, "gpu_memory_utilization": 0.2}, config, 35 * 10**9) == 1  # nothing left


def test_blocks_hit_only_with_their_whole_prefix_and_never_the_last_token(standin):
    cache = standin.PrefixCache(100, 4)
    a = [f"a{n}" for n in range(12)]
    cache.insert(cache.hashes(a))
    assert cache.hit_tokens(a + ["x", "y"]) == 12
    assert cache.hit_tokens(a) == 8  # the whole prompt cached: its last token is computed again (its last block)
    assert cache.hit_tokens(["z", *a[1:]] + ["x"]) == 0  # the same later blocks behind another first block
    assert cache.hit_tokens(a[:6] + ["other"] * 6) == 4  # up to the first block that differs


def test_least_recently_used_blocks_go_first_and_held_ones_stay(standin):
    cache = standin.PrefixCache(6, 4)
    first, second, third = ([f"{tag}{n}" for n in range(9)] for tag in "abc")  # 2 full blocks each
    for tokens in (first, second, third):
        cache.insert(cache.hashes(tokens))
    assert cache.hit_tokens(first) == 8  # all fit: and `first` is now the most recent
    cache.insert(cache.hashes([f"d{n}" for n in range(9)]))  # 8 blocks for 6: the two least recently used go
    assert (cache.hit_tokens(second), cache.hit_tokens(first), cache.hit_tokens(third)) == (0, 8, 8)
    assert cache.evicted == 2
    held = cache.hashes(third)
    cache.hold(held)  # a running request's blocks
    for tag in "efg":
        cache.insert(cache.hashes([f"{tag}{n}" for n in range(9)]))
    assert cache.hit_tokens(third) == 8 and cache.hit_tokens(first) == 0
    cache.release(held)
    for tag in "hij":  # released: evictable again, in its turn
        cache.insert(cache.hashes([f"{tag}{n}" for n in range(9)]))
    assert cache.hit_tokens(third) == 0 and cache.held == {}


def test_a_second_turn_hits_the_first_turns_prompt_and_answer_on_the_counters(model_dir):
    """vLLM's counters count tokens: every prompt token queried, the cached ones hit; the answer's blocks are cached
    when the request ends, so the next turn (which re-sends it) hits them too."""
    server = serve(model_dir, SIM_PREFILL_TOKENS_PER_S="0")
    try:
        messages = [system("rule", 200), {"role": "user", "content": "first question"}]
        q0, h0 = counters(server)
        _, answer, first_tokens = ask(server, messages, max_tokens=40)
        q1, h1 = counters(server)
        assert (q1 - q0, h1 - h0) == (first_tokens, 0)
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "and then?"}]
        _, _, second_tokens = ask(server, messages)
        q2, h2 = counters(server)
        assert q2 - q1 == second_tokens
        # the first turn's prompt and all 40 answer tokens: every full block of them
        assert h2 - h1 == (first_tokens + 40) // 16 * 16
    finally:
        server.stop()


def test_prefill_time_is_the_uncached_tokens_at_the_set_rate(model_dir):
    """1,000 tokens/s: a 600-token prompt waits ~0.6 s before its first token, 1,200 tokens ~1.2 s, and the same
    prompt again (all but its last block cached) hardly at all; the set first-token delay comes on top."""
    server = serve(model_dir, SIM_PREFILL_TOKENS_PER_S="1000", SIM_FIRST_TOKEN_DELAY_MS="50")
    try:
        short, _, n_short = ask(server, [system("short", 590)])
        long_, _, n_long = ask(server, [system("long", 1190)])
        again, _, _ = ask(server, [system("long", 1190)])
    finally:
        server.stop()
    assert n_short >= 590 and n_long >= 1190
    # the prefill's time is a floor (a sleep); what a loaded machine adds on top is not this test's business, so the
    # ceilings are loose: the uncached long prompt pays its whole prefill, the same prompt again less than the short's
    assert 0.05 + n_short / 1000 <= short < 0.05 + n_short / 1000 + 2.0
    assert 0.05 + n_long / 1000 <= long_ < 0.05 + n_long / 1000 + 2.0
    assert 0.05 <= again < 0.05 + n_short / 1000  # 16 tokens or so of prefill, against the short prompt's 590


def test_prefills_queue_behind_each_other_on_one_engine(model_dir):
    """One GPU: two uncached prompts of 500 tokens arriving together at 1,000 tokens/s: the second's first token
    comes after both prefills (~1 s), not after its own alone."""
    server = serve(model_dir, SIM_PREFILL_TOKENS_PER_S="1000")
    results = {}
    try:
        import threading

        def one(tag: str) -> None:
            results[tag] = ask(server, [system(tag, 495)])[0]

        threads = [threading.Thread(target=one, args=(tag,)) for tag in ("p", "q")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        server.stop()
    assert min(results.values()) >= 0.5 and max(results.values()) >= 1.0, results


def test_the_cache_evicts_at_its_budget(model_dir):
    """--num-gpu-blocks-override 60 (960 tokens): three 400-token system prompts do not all fit; the least recently
    used leaves first, so the first prompt misses after the third, and the third still hits."""
    server = serve(model_dir, "--num-gpu-blocks-override", "60", SIM_PREFILL_TOKENS_PER_S="0")
    try:
        prompts = [[system(tag, 400), {"role": "user", "content": "hi"}] for tag in ("x", "y", "z")]
        for messages in prompts:
            ask(server, messages)
        q0, h0 = counters(server)
        ask(server, prompts[2])
        q1, h1 = counters(server)
        ask(server, prompts[0])
        q2, h2 = counters(server)
        log = server.stop()
    finally:
        server.stop()
    assert h1 - h0 >= 400 and h1 - h0 > 0.9 * (q1 - q0)  # the most recent: still there
    assert h2 - h1 == 0 and q2 - q1 > 400  # the oldest: evicted
    assert "GPU KV cache size: 960 tokens (60 blocks of 16" in log


def test_the_default_budget_on_the_sims_share_holds_every_benchmark_prompt(model_dir):
    """No override: the share of a 128 GB Spark (--gpu-memory-utilization 0.3, the sim's) at the fallback 20,480
    bytes a token is ~1.7 million tokens: a long system prompt stays cached after many others."""
    server = serve(model_dir, "--gpu-memory-utilization", "0.3", SIM_PREFILL_TOKENS_PER_S="0")
    try:
        first = [system("keep", 300)]
        ask(server, first)
        for n in range(10):
            ask(server, [system(f"other{n}-", 300)])
        q0, h0 = counters(server)
        ask(server, first)
        q1, h1 = counters(server)
        log = server.stop()
    finally:
        server.stop()
    assert h1 - h0 == (q1 - q0 - 1) // 16 * 16
    blocks = int((128e9 * 0.3 - 3 * GIB) // (16 * 20480))  # make_model's shards are a few hundred bytes
    assert f"GPU KV cache size: {blocks * 16:,} tokens" in log
