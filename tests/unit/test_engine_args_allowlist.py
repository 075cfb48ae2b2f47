"""Engine arguments by allow-list (issue 36, item 2): extra_engine_args and the engine's own engine_env variables
pass only where the pinned flag table marks them reviewed, and a reviewed flag's value never names a hub
repository, a URL, a path or a Python class: each would load bytes that sparkfleet neither pinned nor verified."""

import pytest

from sparkfleet.contract.settings import SettingsError
from sparkfleet.release.engines import ENGINE_CLASSES
from sparkfleet.release.plan import plan_hosts

from .helpers import host_data

SGLANG = dict(engine="sglang", engine_image="lmsysorg/sglang:spark", limit_mm_per_prompt=None,
              attention_backend=None, tool_call_parser="qwen3_coder", reasoning_parser="qwen3")
LLAMA = dict(engine="llamacpp", engine_image="ghcr.io/ggml-org/llama.cpp:server-cuda-b11669",
             model_repo="ggml-org/tiny-GGUF", model_files=["tiny-Q4_K_M.gguf"], served_model_name="tiny",
             max_model_len=4096, limit_mm_per_prompt=None, attention_backend=None, tool_call_parser=None,
             reasoning_parser=None, enable_auto_tool_choice=False)
VLLM: dict = {}
ENGINE = {"vllm": VLLM, "sglang": SGLANG, "llamacpp": LLAMA}


def problems(**data) -> list[str]:
    with pytest.raises(SettingsError) as caught:
        plan_hosts([("spark-x", host_data(**data))], resolve=False)
    return caught.value.problems


def accepted(**data):
    [plan] = plan_hosts([("spark-x", host_data(**data))], resolve=False)
    return plan


def unreviewed(flag: str, label: str) -> str:
    return f"`{flag}` is not on sparkfleet's reviewed list for {label}"


# The payloads: each loads bytes from the hub, a URL or a Python path into the engine.
HOSTILE_ARGS = [
    ("llamacpp", ["--spec-draft-hf", "evil/draft-GGUF"], "--spec-draft-hf"),
    ("llamacpp", ["--hf-repo-draft", "evil/draft-GGUF"], "--hf-repo-draft"),
    ("llamacpp", ["-hfd", "evil/draft-GGUF"], "-hfd"),
    ("llamacpp", ["-hfrd", "evil/draft-GGUF"], "-hfrd"),
    ("llamacpp", ["--mmproj-url", "http://evil.example/mmproj.gguf"], "--mmproj-url"),
    ("llamacpp", ["-mmu", "http://evil.example/mmproj.gguf"], "-mmu"),
    ("vllm", ["--tool-parser-plugin", "/models/x/parser.py"], "--tool-parser-plugin"),
    ("vllm", ["--reasoning-parser-plugin", "/models/x/parser.py"], "--reasoning-parser-plugin"),
    ("vllm", ["--worker-cls", "evil.worker.Worker"], "--worker-cls"),
    ("vllm", ["--enable-lora", "--lora-modules", "a=org/repo"], "--enable-lora"),
    ("vllm", ["--enable-lora", "--lora-modules", "a=org/repo"], "--lora-modules"),
    ("vllm", ["--tokenizer", "org/repo"], "--tokenizer"),
    ("sglang", ["--lora-paths", "a=org/repo"], "--lora-paths"),
    ("sglang", ["--tokenizer-path", "org/repo"], "--tokenizer-path"),
    ("sglang", ["--enable-lora"], "--enable-lora"),
]


@pytest.mark.parametrize("engine,args,flag", HOSTILE_ARGS, ids=[f"{e}:{f}" for e, _, f in HOSTILE_ARGS])
def test_flags_that_load_unverified_bytes_are_refused_naming_the_flag_and_the_fix(engine, args, flag):
    label = ENGINE_CLASSES[engine].label
    found = problems(**ENGINE[engine], extra_engine_args=args)
    [line] = [p for p in found if f"`{flag}`" in p]
    assert line.startswith(f"spark-x: setting `extra_engine_args`: {unreviewed(flag, label)}"), line
    assert "docs/settings.md" in line and "\n" not in line
    assert "org/repo" not in line and "evil" not in line  # the value is never echoed


HOSTILE_ENV = [
    ("llamacpp", "LLAMA_ARG_SPEC_DRAFT_HF_REPO", "evil/draft-GGUF"),
    ("llamacpp", "LLAMA_ARG_MMPROJ_URL", "http://evil.example/mmproj.gguf"),
    ("llamacpp", "LLAMA_ARG_HF_REPO", "evil/model-GGUF"),
    ("vllm", "VLLM_TOOL_PARSER_PLUGIN", "/models/x/parser.py"),
    ("vllm", "VLLM_SOME_FLAG_OF_THE_NEXT_RELEASE", "1"),
    ("sglang", "SGLANG_SOME_FLAG_OF_THE_NEXT_RELEASE", "1"),
]


@pytest.mark.parametrize("engine,var,value", HOSTILE_ENV, ids=[v for _, v, _ in HOSTILE_ENV])
def test_the_engines_own_environment_variables_are_refused_unless_reviewed(engine, var, value):
    found = problems(**ENGINE[engine], engine_env={var: value})
    [line] = [p for p in found if var in p]
    assert line.startswith(f"spark-x: engine_env sets {var}"), line
    assert value not in line  # engine_env values are secret: never echoed


@pytest.mark.parametrize("engine,args,flag,what", [
    ("vllm", ["--quantization", "org/repo"], "--quantization", "names a hub repository"),
    ("vllm", ["--quantization=http://evil.example/q"], "--quantization", "names a URL"),
    ("vllm", ["--quantization", "/models/x/quant.py"], "--quantization", "names a path"),
    ("vllm", ["--optimization-level", "../x"], "--optimization-level", "names a path"),
    ("vllm", ["--quantization", "evil.quant.Method"], "--quantization", "names a Python class"),
    ("vllm", ["--compilation-config", '{"backend": "evil.backend.compile"}'], "--compilation-config",
     "names a Python class"),
    ("vllm", ["--max-num-batched-tokens", "org/repo"], "--max-num-batched-tokens", "names a hub repository"),
    ("vllm", ["--dtype", "float8"], "--dtype", "is not one of"),
    ("llamacpp", ["-ctk", "org/repo"], "-ctk", "names a hub repository"),
    ("sglang", ["--quantization", "org/repo"], "--quantization", "is not one of"),
])
def test_a_reviewed_flags_value_never_names_a_repository_url_path_or_class(engine, args, flag, what):
    [line] = [p for p in problems(**ENGINE[engine], extra_engine_args=args) if f"`{flag}`" in p]
    assert what in line and "org/repo" not in line and "evil" not in line, line


def test_a_value_that_follows_no_flag_is_refused():
    [line] = problems(extra_engine_args=["--enforce-eager", "org/repo"])
    assert line == ("spark-x: setting `extra_engine_args`: extra_engine_args[1] follows no flag that takes a value: "
                    "remove it")


@pytest.mark.parametrize("engine,args", [
    ("vllm", ["--mamba-ssm-cache-dtype", "float32"]),  # the nemotron recipe's
    ("vllm", ["--max-num-batched-tokens", "8192", "--enforce-eager", "--no-enforce-eager", "--seed", "-1"]),
    ("vllm", ["--disable-log-requests", "--no-enable-log-outputs", "--no-trust-remote-code"]),
    ("vllm", ["--compilation-config", '{"cudagraph_mode": "FULL", "level": 3}', "--max-num-batched-tokens=16k"]),
    ("vllm", ["--cudagraph-capture-sizes", "1", "2", "4", "--dtype", "bfloat16"]),
    ("sglang", ["--chunked-prefill-size", "4096", "--disable-cuda-graph", "--schedule-policy", "lpm"]),
    ("llamacpp", ["-fa", "on", "-ctk", "q8_0", "--cache-type-v=q8_0", "-b", "2048", "--no-cont-batching"]),
    ("llamacpp", ["-fa", "--temp", "0.7"]),
])
def test_reviewed_flags_and_values_are_accepted(engine, args):
    assert accepted(**ENGINE[engine], extra_engine_args=args).engine_args[-len(args):] == args


def test_reviewed_environment_variables_are_accepted():
    accepted(**LLAMA, engine_env={"LLAMA_ARG_FLASH_ATTN": "on", "LLAMA_ARG_CACHE_TYPE_K": "q8_0", "TZ": "UTC"})
    accepted(engine_env={"VLLM_LOGGING_LEVEL": "DEBUG", "VLLM_PLUGINS": "a,b", "NCCL_DEBUG": "INFO"})


def test_a_reviewed_environment_variables_value_is_checked_too():
    [line] = [p for p in problems(**LLAMA, engine_env={"LLAMA_ARG_CACHE_TYPE_K": "org/repo"})
              if "LLAMA_ARG_CACHE_TYPE_K" in p]
    assert "names a hub repository" in line and "org/repo" not in line


def test_a_service_gets_the_same_allow_list():
    found = problems(services={"embed": {"recipe": "qwen3-embedding-0.6b",
                                         "extra_engine_args": ["--tool-parser-plugin", "/x/p.py"]}})
    assert any(p.startswith("spark-x: service 'embed': extra_engine_args: `--tool-parser-plugin` is not on "
                            "sparkfleet's reviewed list for vLLM") for p in found), found
    accepted(services={"embed": {"recipe": "qwen3-embedding-0.6b", "extra_engine_args": ["--max-num-seqs", "8"]}})


def test_every_reviewed_flag_is_a_flag_of_its_table_with_a_known_kind():
    for engine in ENGINE_CLASSES.values():
        for version in engine.supported_versions():
            table = engine.flag_table(version)
            assert table.reviewed, (engine.name, version)
            for flag, kind in table.reviewed.items():
                assert flag in table.flags and "alias_of" not in table.flags[flag], (engine.name, flag)
                assert kind in table.KINDS, (engine.name, flag, kind)
