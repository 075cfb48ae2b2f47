"""A fixed KV cache (kv_cache_memory_bytes): several engines on one Spark plan in bytes, not in shares picked by
hand. The share each engine asks (vLLM's --gpu-memory-utilization, the memory plan's row, the pre-start check) is
derived from its weights, its reserve and that cache; an oversubscribed host is refused before any host is touched,
naming every engine's bytes; a single-model inventory without the setting plans exactly as before."""

from __future__ import annotations

import math

import pytest

from sparkfleet.contract.recipes import known_model
from sparkfleet.model.fit import RESERVE_BYTES
from sparkfleet.release.services import SERVICE_RESERVE_BYTES
from tests.unit.test_services import plan, refused

GIB = 1024**3
CHAT_WEIGHTS = known_model("Qwen/Qwen3.5-35B-A3B-FP8").weight_bytes
EMBED_WEIGHTS = known_model("Qwen/Qwen3-Embedding-0.6B").weight_bytes


def flag(args: list[str], name: str) -> str | None:
    """The value after `name` in an argument list (None: the flag is not there)."""
    return args[args.index(name) + 1] if name in args else None


def test_the_chat_models_share_is_its_weights_reserve_and_fixed_cache():
    p = plan(kv_cache_memory_bytes=20 * GIB)
    share = math.ceil((CHAT_WEIGHTS + RESERVE_BYTES + 20 * GIB) / 128e9 * 10_000) / 10_000
    assert 0.3 < share < 0.6  # ~35 GB of weights, 3 GiB of reserve, 20 GiB of cache on a 128 GB Spark
    assert flag(p.engine_args, "--kv-cache-memory-bytes") == str(20 * GIB)
    assert flag(p.engine_args, "--gpu-memory-utilization") == f"{share:g}"
    assert p.memory_plan["shares"]["chat"]["share"] == share
    assert p.fit.kv_memory_bytes >= 20 * GIB  # the fit counts at least the cache vLLM will hold
    assert p.fit.kv_memory_bytes - 20 * GIB < 13e6  # and at most the 1/10,000 of the share's rounding more


def test_a_service_with_a_fixed_cache_gets_its_own_derived_share():
    embed = plan(services={"embed": {"recipe": "qwen3-embedding-0.6b", "kv_cache_memory_bytes": 2 * GIB}}).services[0]
    share = math.ceil((EMBED_WEIGHTS + SERVICE_RESERVE_BYTES + 2 * GIB) / 128e9 * 10_000) / 10_000
    assert (flag(embed.engine_args, "--gpu-memory-utilization"), flag(embed.engine_args, "--kv-cache-memory-bytes")) \
        == (f"{share:g}", str(2 * GIB))


def test_an_overcommitted_host_is_refused_naming_every_engines_bytes():
    """The chat model's 80 GiB of cache beside a service's 10 GiB: more than gpu_memory_budget; one line names
    each engine's share and bytes and what fits."""
    problems = refused(kv_cache_memory_bytes=80 * GIB,
                       services={"embed": {"recipe": "qwen3-embedding-0.6b", "kv_cache_memory_bytes": 10 * GIB}})
    [line] = problems
    assert line.startswith("spark-a: the host's GPU memory is oversubscribed: gpu_memory_utilization shares sum to ")
    assert "chat 0." in line and "embed 0." in line and " GB)" in line
    assert ("lower a share (gpu_memory_utilization, or kv_cache_memory_bytes where set), mark a rarely used "
            "service on_demand, or move a service") in line


def test_a_cache_larger_than_the_host_is_refused_in_one_line():
    assert refused(kv_cache_memory_bytes=120 * 10**9) == [
        f"spark-a: kv_cache_memory_bytes 120,000,000,000 beside the weights ({CHAT_WEIGHTS / 1e9:.1f} GB) and the "
        f"reserve needs {math.ceil((CHAT_WEIGHTS + RESERVE_BYTES + 120e9) / 128e9 * 10_000) / 10_000:g} of the "
        f"host's memory (host_memory_gb): lower kv_cache_memory_bytes"]


@pytest.mark.parametrize("value", [-1, 0, True, 1024, "lots", 2**60, 1.5e9 + 0.5, "20GiB", [1]])
def test_a_hostile_cache_size_is_refused_naming_the_setting(value):
    problems = refused(kv_cache_memory_bytes=value)
    assert len(problems) == 1 and "kv_cache_memory_bytes" in problems[0], problems


@pytest.mark.parametrize("engine_data, fix", [
    ({"recipe": "qwen3-8b-gguf"}, "llama-server's KV cache is its context: set max_model_len"),
    ({"recipe": "qwen3.5-35b-a3b-fp8-sglang"}, "sparkfleet plans a fixed KV cache for vLLM only"),
])
def test_engines_without_a_fixed_cache_flag_are_refused_with_the_fix(engine_data, fix):
    problems = refused(kv_cache_memory_bytes=8 * GIB, **engine_data)
    assert any("kv_cache_memory_bytes" in p and fix in p for p in problems), problems


def test_the_flag_in_extra_engine_args_is_refused_for_the_setting():
    problems = refused(extra_engine_args=["--kv-cache-memory-bytes", "1000000000"])
    assert any("kv_cache_memory_bytes" in p for p in problems), problems
    problems = refused(services={"embed": {"recipe": "qwen3-embedding-0.6b",
                                           "extra_engine_args": ["--kv-cache-memory-bytes=1000000000"]}})
    assert any("`kv_cache_memory_bytes`" in p for p in problems), problems


def test_without_the_setting_a_release_plans_byte_identical_to_before():
    """None (the default) adds no flag and changes no share, so today's fleets keep their release ids."""
    before, after = plan(), plan(kv_cache_memory_bytes=None)
    assert "--kv-cache-memory-bytes" not in before.engine_args
    assert (after.engine_args, after.release_id, after.render_unit()) == (before.engine_args, before.release_id,
                                                                           before.render_unit())
    assert flag(before.engine_args, "--gpu-memory-utilization") == "0.88"


def test_a_fixed_cache_too_small_for_one_sequence_names_the_setting_that_grows_it():
    """The fit's refusal of a cache that holds no sequence of max_model_len: raise kv_cache_memory_bytes (the
    share follows it), not gpu_memory_utilization, which it overrides."""
    [line] = refused(kv_cache_memory_bytes=2**30)
    assert line.startswith("spark-a: max_model_len=262144 needs ") and "raise kv_cache_memory_bytes" in line, line
    assert "gpu_memory_utilization" not in line, line
    problems = refused(services={"embed": {"recipe": "qwen3-embedding-0.6b", "kv_cache_memory_bytes": 2**20,
                                           "max_model_len": 32768}})
    assert any(p.endswith("(its share: services['embed'].kv_cache_memory_bytes)") for p in problems), problems
