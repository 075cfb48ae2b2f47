"""Several chat models on one Spark: a chat recipe as a service beside the host's chat model, planned as a release of
its own (the defaults, its recipe, its entry; none of the host's own model's parsers or flags), in the host's vLLM
image, with its own unit, port, share of the memory plan and front door route."""

from __future__ import annotations

import pytest

from sparkfleet.roles.front_door import plan as fd_plan
from sparkfleet.release.plan import plan_hosts
from tests.unit.helpers import host_data
from tests.unit.test_front_door import NAME, plans
from tests.unit.test_kv_budget import flag
from tests.unit.test_services import fake_resolver, plan, refused

GIB = 1024**3
CODER = {"recipe": "qwen3-coder-30b-a3b-fp8", "api_port": 8003, "kv_cache_memory_bytes": 8 * GIB,
         "max_model_len": 65536}
CODER_NAME = "Qwen3-Coder-30B-A3B-Instruct"


def test_a_coding_model_beside_the_chat_model_gets_its_own_release_unit_and_share():
    host = plan(kv_cache_memory_bytes=20 * GIB, services={"coder": CODER})
    [coder] = host.services
    assert (coder.kind, coder.unit, coder.container) == ("chat", "sparkfleet-vllm-coder.service", "vllm-coder")
    args = coder.engine_args
    assert args[0] == "/var/lib/sparkfleet/models/Qwen--Qwen3-Coder-30B-A3B-Instruct-FP8@unresolved"
    assert (flag(args, "--served-model-name"), flag(args, "--port"), flag(args, "--max-model-len"),
            flag(args, "--tool-call-parser"), flag(args, "--kv-cache-memory-bytes")) == (
        CODER_NAME, "18003", "65536", "qwen3_coder", str(8 * GIB))
    # the host's own model's settings stay its own: Qwen3.5's reasoning parser, multimodal limit, attention backend
    assert "--reasoning-parser" not in args and "--limit-mm-per-prompt" not in args
    shares = {name: row["share"] for name, row in host.memory_plan["shares"].items()}
    assert shares["coder"] == float(flag(args, "--gpu-memory-utilization")) and host.memory_plan["fits"]
    assert host.memory_plan["start"]["order"] == ["sparkfleet-vllm.service", "sparkfleet-vllm-coder.service"]
    unit = host.render_service_unit(coder)
    assert f"    {host.engine_ref} \\\n" in unit and "--served-model-name Qwen3-Coder-30B-A3B-Instruct" in unit
    assert coder.record()["endpoint"] == "/v1/chat/completions"


def test_adding_a_chat_model_leaves_the_host_models_release_alone():
    """The host's chat model keeps its unit and its part of the release: adding or dropping the coder restarts
    nothing of it (the host's release id changes: the coder is part of it)."""
    resolve = fake_resolver()
    alone, both = (plan_hosts([("spark-a", host_data(gpu_memory_utilization=0.5, **extra))], resolve=resolve)[0]
                   for extra in ({}, {"services": {"coder": CODER}}))
    assert alone.release_id == alone.chat_release_id == both.chat_release_id != both.release_id
    assert both.render_unit() == alone.render_unit()
    assert both.release_record({})["services"]["coder"]["model_dir"].endswith("Qwen3-Coder-30B-A3B-Instruct-FP8@"
                                                                             + "c" * 16)


def test_the_hosts_own_flags_never_reach_the_other_model():
    host = plan(extra_engine_args=["--max-num-batched-tokens", "8192"], max_num_seqs=4, gpu_memory_utilization=0.5,
                services={"coder": CODER})
    args = host.services[0].engine_args
    assert "--max-num-batched-tokens" not in args and "--max-num-seqs" not in args
    extra = ["--max-num-batched-tokens", "4096"]
    own = plan(gpu_memory_utilization=0.5, services={"coder": {**CODER, "extra_engine_args": extra}})
    assert own.services[0].engine_args[-2:] == extra


def test_two_models_at_the_recipes_shares_are_refused_naming_both():
    [line] = refused(services={"coder": {"recipe": "qwen3-coder-30b-a3b-fp8", "api_port": 8003}})
    assert line.startswith("spark-a: the host's GPU memory is oversubscribed: gpu_memory_utilization shares sum to "
                           "1.76 > gpu_memory_budget 0.95: chat 0.88 (112.6 GB), coder 0.88 (112.6 GB)."), line


@pytest.mark.parametrize("entry, expected", [
    ({**CODER, "max_model_len": 10**7}, "spark-a: service 'coder': max_model_len=10000000 exceeds "
                                        "Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8's maximum of 262144"),
    ({**CODER, "extra_engine_args": ["--tool-call-parser", "hermes"]}, "tool_call_parser"),
    ({**CODER, "extra_engine_args": ["--api-key", "x"]}, "--api-key"),
    ({**CODER, "hf_overrides": {"x": 1}}, "hf_overrides is a pooling service's key"),
    ({**CODER, "tool_call_parser": "hermes"}, "tool_call_parser"),
    ({**CODER, "api_port": 8000}, "port 8000 is taken by api_port and services['coder'].api_port"),
    ({**CODER, "served_model_name": "bad name\nX-Injected: 1"}, "served_model_name"),
])
def test_a_bad_chat_service_entry_is_refused_with_its_fix(entry, expected):
    problems = refused(services={"coder": entry})
    assert any(expected in p for p in problems), problems


def test_the_front_door_routes_the_second_model_to_its_port():
    fleet = plans(**{"spark-1": {"services": {"coder": CODER}, "kv_cache_memory_bytes": 20 * GIB}, "spark-2": {}})
    door = fd_plan.front_door_plan("spark-1", fleet)
    assert door.served_names == tuple(sorted((NAME, CODER_NAME)))
    [route] = [r for r in door.routes if r.served_name == CODER_NAME]
    assert (route.kind, [(b.name, b.port) for b in route.backends]) == ("chat", [("spark-1", 8003)])
