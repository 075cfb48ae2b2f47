"""sparkfleet.bench against the stand-in vLLM server (a local process, no Docker)."""

from __future__ import annotations

import argparse
import json

import pytest

from sparkfleet.commands import bench as bench_command
from sparkfleet.fleet import bench
from sparkfleet.refused import Refused

from .helpers import Server, host_data, make_model, qwen35_config

NAME = "Qwen3.5-35B-A3B"
RATE = 25.0  # SIM_TOKENS_PER_S: 40 ms between tokens, so a client starved on a busy machine still reads them apart
MAX_TOKENS = 10
DELAY_MS = 100.0  # SIM_FIRST_TOKEN_DELAY_MS
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = make_model(tmp_path_factory.mktemp("bench") / "model")
    s = Server(model, "--served-model-name", NAME, "--enable-prefix-caching",
               SIM_TOKENS_PER_S=str(int(RATE)), SIM_FIRST_TOKEN_DELAY_MS=str(int(DELAY_MS)),
               SIM_LOAD_DELAY_S="0")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def result(server):
    return bench.run_bench(server.base, NAME, None, concurrency=[1, 4], max_tokens=MAX_TOKENS,
                           think=False, requests_per_level=4, roofline=80.0)


def test_single_stream_decode_matches_the_set_rate(result):
    # loose here (a unit test on a busy machine); the 5% acceptance is tests/e2e/test_bench.py's
    assert result["single_stream_decode_tokens_per_s"] == pytest.approx(RATE, rel=0.2)
    assert result["roofline_tokens_per_s"] == 80.0
    assert result["decode_vs_roofline"] == pytest.approx(RATE / 80.0, rel=0.2)


def test_ttft_never_below_the_set_delay(result):
    for level in result["levels"]:
        assert DELAY_MS <= level["ttft_ms"]["p50"] <= DELAY_MS + 500, level


def test_levels_complete_without_errors_and_scale(result):
    by_c = {level["concurrency"]: level for level in result["levels"]}
    assert set(by_c) == {1, 4} and result["errors"] == 0
    for level in by_c.values():
        assert level["requests"] == level["ok"] == 4 and level["errors"] == 0
        assert level["completion_tokens"] == 4 * MAX_TOKENS  # ignore_eos: every request gets max_tokens
        assert level["tpot_ms"]["p50"] == pytest.approx(1000 / RATE, rel=0.2)
        assert level["itl_ms"]["p50"] == pytest.approx(1000 / RATE, rel=0.3)
        assert level["itl_ms"]["p50"] <= level["itl_ms"]["p90"] <= level["itl_ms"]["p99"]
    assert by_c[4]["aggregate_tokens_per_s"] > by_c[1]["aggregate_tokens_per_s"] * 2


def test_prefix_cache_read_before_and_after(result):
    cache = result["prefix_cache"]
    assert cache["after"]["queries"] > cache["before"]["queries"]
    # every request shares the system prompt, which the warm-up put in the cache
    assert cache["during"]["hits"] > 0 and 0 < cache["during"]["hit_rate"] < 1


def test_outputs_written(result, tmp_path, capsys):
    json_path, png_path = bench.write_outputs(result, tmp_path / "out")
    assert json.loads(json_path.read_text())["single_stream_decode_tokens_per_s"] == \
        result["single_stream_decode_tokens_per_s"]
    assert png_path.read_bytes().startswith(PNG_SIGNATURE)
    bench.print_table(result)
    out = capsys.readouterr().out
    assert f"sparkfleet bench: {NAME}" in out and "TTFT p50/p90/p99 ms" in out
    assert "roofline 80.0 tokens/s" in out and "prefix cache hit rate" in out


def test_prefix_cache_counters_with_and_without_total():
    text = ('# TYPE vllm:prefix_cache_hits counter\n'
            'vllm:prefix_cache_hits{engine="0",model_name="m"} 30.0\n'
            'vllm:prefix_cache_hits{engine="1",model_name="m"} 10.0\n'
            'vllm:prefix_cache_queries{engine="0",model_name="m"} 80\n'
            'vllm:prefix_cache_queries{engine="1",model_name="m"} 20\n')
    assert bench.parse_prefix_cache(text) == {"hits": 40.0, "queries": 100.0, "hit_rate": 0.4}
    assert bench.parse_prefix_cache(text.replace("_hits{", "_hits_total{")
                                    .replace("_queries{", "_queries_total{"))["hit_rate"] == 0.4
    assert bench.parse_prefix_cache("vllm:num_requests_running 0\n") is None


def test_main_with_url_writes_json_and_png(server, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    bench_command.arguments(parser)
    args = parser.parse_args(["--url", server.base + "/v1", "--concurrency", "2", "--max-tokens", "5",
                              "--requests", "2", "--out", str(tmp_path)])
    assert args.think is False and args.model is None
    assert bench_command.run(args) == 0
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["model"] == NAME and saved["url"] == server.base
    assert saved["single_stream_decode_tokens_per_s"] is None  # no concurrency-1 level
    assert (tmp_path / "bench.png").read_bytes().startswith(PNG_SIGNATURE)
    assert "single-stream decode" in capsys.readouterr().out


def test_main_refuses_wrong_model_and_missing_target(server, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    bench_command.arguments(parser)
    with pytest.raises(Refused) as missing:
        bench_command.run(parser.parse_args(["--out", str(tmp_path)]))
    assert missing.value.code == 2
    args = parser.parse_args(["--url", server.base, "--model", "nope", "--out", str(tmp_path)])
    with pytest.raises(Refused) as failed:
        bench_command.run(args)
    assert failed.value.code == 1 and "NotFoundError" in str(failed.value)
    assert not (tmp_path / "bench.json").exists()


def test_main_with_inventory_takes_url_model_and_key_from_the_host(server, tmp_path, monkeypatch):
    inventory = tmp_path / "inventory.py"
    inventory.write_text(f"sparks = [('spark-a', {{'ssh_hostname': '127.0.0.1', "
                         f"'controller_api_url': '{server.base}/'}})]\n")
    monkeypatch.setattr(bench, "_roofline", lambda name, data, max_tokens: 100.0)
    parser = argparse.ArgumentParser()
    bench_command.arguments(parser)
    args = parser.parse_args([str(inventory), "--host", "spark-a", "--concurrency", "1",
                              "--max-tokens", "3", "--requests", "1", "--out", str(tmp_path / "out")])
    assert bench_command.run(args) == 0
    saved = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert saved["url"] == server.base and saved["model"] == NAME
    assert saved["roofline_tokens_per_s"] == 100.0 and saved["decode_vs_roofline"] > 0


def test_roofline_is_the_plans_fit_at_the_runs_context(monkeypatch):
    """The plan's fit, with the host's bandwidth setting, at max_tokens + 128 tokens of context."""
    from sparkfleet.model import hubs
    from sparkfleet.model.manifest import Manifest, ManifestFile

    manifest = Manifest("modelscope", "Qwen/Qwen3.5-35B-A3B-FP8", "master", "a" * 40,
                        (ManifestFile("model.safetensors", 35 * 10**9, sha256="0" * 64),
                         ManifestFile("config.json", 100, sha256="1" * 64)))
    monkeypatch.setattr(hubs, "hub_resolver", lambda s: (manifest, qwen35_config(), None))
    # 3,545,527,552 bytes per token at no context (test_fit) + 640 x 20,480 of KV = 3,558,634,752:
    # 273e9 / that = 76.71 tokens/s; at 200 GB/s, 56.20.
    assert bench._roofline("spark-a", host_data(), 512) == pytest.approx(76.71, abs=0.005)
    assert bench._roofline("spark-a", host_data(memory_bandwidth_gbs=200), 512) == pytest.approx(56.20, abs=0.005)
    monkeypatch.setattr(hubs, "hub_resolver", lambda s: (None, None, "hub down"))
    # Offline, the recipe catalogue knows the default model: the same roofline (it reads no weight total).
    assert bench._roofline("spark-a", host_data(), 512) == pytest.approx(76.71, abs=0.005)
    assert bench._roofline("spark-a", host_data(model_repo="Acme/Unknown-7B"), 512) is None
