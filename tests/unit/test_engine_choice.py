"""The engine interface (release/engines/): arguments per engine, their flag tables, the refusals, the key."""

import pytest

from sparkfleet.contract.settings import SettingsError
from sparkfleet.model.manifest import Manifest, ManifestFile
from sparkfleet.release.engines import ENGINE_CLASSES, engine_for
from sparkfleet.release.engines.llamacpp import UNRESOLVED_ENTRY
from sparkfleet.release.plan import plan_hosts

from .helpers import host_data

KEY = "sk-engine-test-key-0123456789"
SGLANG = dict(engine="sglang", engine_image="lmsysorg/sglang:spark", limit_mm_per_prompt=None,
              attention_backend=None, tool_call_parser="qwen3_coder", reasoning_parser="qwen3")
LLAMA = dict(engine="llamacpp", engine_image="ghcr.io/ggml-org/llama.cpp:server-cuda-b11669",
             model_repo="ggml-org/tiny-GGUF", model_files=["tiny-Q4_K_M.gguf"], served_model_name="tiny", max_model_len=4096, limit_mm_per_prompt=None,
             attention_backend=None, tool_call_parser=None, reasoning_parser=None, enable_auto_tool_choice=False)


def plan(**overrides):
    [p] = plan_hosts([("spark-a", host_data(**overrides))], resolve=False)
    return p


def refusal(**overrides) -> str:
    with pytest.raises(SettingsError) as err:
        plan(**overrides)
    return "\n".join(err.value.problems)


def manifest(*paths):
    files = tuple(ManifestFile(p, 10, sha256=f"{i:064x}") for i, p in enumerate(paths, 1))
    return Manifest("huggingface", "ggml-org/tiny-GGUF", "main", "a" * 40, files)


def resolved(files, **overrides):
    [p] = plan_hosts([("spark-a", host_data(**overrides))], resolve=lambda s: (manifest(*files), None, None))
    return p


def test_each_engine_names_its_version_setting_format_and_table():
    for name, engine in ENGINE_CLASSES.items():
        assert engine.name == name and engine.version_setting == f"{name}_version"
        assert engine.model_format == ("gguf" if name == "llamacpp" else "safetensors")
        assert engine.supported_versions(), name
    assert ENGINE_CLASSES["sglang"].flag_table("0.5.23").entrypoint == ("python3", "-m", "sglang.launch_server")
    assert ENGINE_CLASSES["llamacpp"].flag_table("11669").entrypoint == ("llama-server",)


def test_the_default_is_vllm_and_its_unit_names_it():
    p = plan()
    assert p.engine.name == "vllm" and p.to_dict()["engine"] == "vllm"
    assert "Description=vLLM OpenAI-compatible server: Qwen3.5-35B-A3B" in p.render_unit()
    assert "--entrypoint" not in p.docker_options


def test_sglang_arguments_from_settings():
    p = plan(**SGLANG, max_num_seqs=8, enable_prefix_caching=False)
    args = p.engine_args
    assert args[:4] == ["-m", "sglang.launch_server", "--model-path", p.model_dir]
    for flag, value in [("--served-model-name", "Qwen3.5-35B-A3B"), ("--host", "127.0.0.1"), ("--port", "18000"),
                        ("--context-length", "262144"), ("--mem-fraction-static", "0.88"),
                        ("--tool-call-parser", "qwen3_coder"), ("--reasoning-parser", "qwen3"),
                        ("--max-running-requests", "8")]:
        assert args[args.index(flag) + 1] == value
    assert "--enable-metrics" in args and "--disable-radix-cache" in args
    assert p.docker_options[-2:] == ["--entrypoint", "python3"]
    assert p.engine.flag_table("0.5.23").problems(args[2:]) == []
    assert "Description=SGLang server: Qwen3.5-35B-A3B" in p.render_unit()


def test_sglang_refusals():
    vllm_image = {**SGLANG, "engine_image": "vllm/vllm-openai:v0.33.0"}
    assert 'set engine_image = "lmsysorg/sglang:spark"' in refusal(**vllm_image)
    parser = refusal(**{**SGLANG, "tool_call_parser": "no_such_parser"})
    assert "tool_call_parser='no_such_parser' is not one of SGLang 0.5.23's --tool-call-parser names" in parser
    assert "qwen3_coder" in parser
    assert "tensor parallelism over Sparks runs on vLLM's Ray path" in refusal(**SGLANG, tensor_parallel_size=2)
    assert "`--no-such-flag` is not a flag of SGLang 0.5.23" in refusal(**SGLANG, extra_engine_args=["--no-such-flag"])
    assert "would put a secret" in refusal(**SGLANG, extra_engine_args=["--api-key", "x" * 20])
    assert "`--config` reads more flags" in refusal(**SGLANG, extra_engine_args=["--config", "/etc/x.yaml"])
    assert "set `max_num_seqs` instead" in refusal(**SGLANG, extra_engine_args=["--max-running-requests", "3"])
    assert "set engine = \"llamacpp\"" in refusal(**SGLANG, model_files=["*Q4_K_M*.gguf"])
    assert "sparkfleet drives MTP" in refusal(**SGLANG, speculative_method="mtp", num_speculative_tokens=2)
    rag = {"vectors": {"recipe": "qwen3-embedding-0.6b", "api_port": 9100, "max_model_len": 4096}}
    assert "pooling models that run on vLLM" in refusal(**SGLANG, services=rag)


def test_llamacpp_arguments_from_settings():
    p = plan(**LLAMA, max_num_seqs=4)
    assert p.engine_args == ["-m", f"{p.model_dir}/tiny-Q4_K_M.gguf", "--alias", "tiny", "--host", "127.0.0.1",
                             "--port", "18000", "-c", "4096", "-ngl", "999", "--jinja", "--metrics", "--parallel", "4"]
    assert p.engine.flag_table("11669").problems(p.engine_args) == []
    assert "Description=llama.cpp llama-server: tiny" in p.render_unit()


def test_llamacpp_entry_file_from_the_manifest_or_a_placeholder():
    p = resolved(["README.md", "tiny-Q8_0-00002-of-00002.gguf", "tiny-Q8_0-00001-of-00002.gguf"],
                 **{**LLAMA, "model_files": ["*Q8_0*.gguf"]})
    assert p.engine_args[1] == f"{p.model_dir}/tiny-Q8_0-00001-of-00002.gguf"
    assert plan(**{**LLAMA, "model_files": ["*.gguf"]}).engine_args[1].endswith(UNRESOLVED_ENTRY)


def test_llamacpp_refusals():
    # values other than the defaults: a default equal to the user's is not the user's (another model neutralises it)
    for setting, value in [("tool_call_parser", "hermes"), ("reasoning_parser", "deepseek_r1"),
                           ("limit_mm_per_prompt", {"image": 1}), ("attention_backend", "TRITON_ATTN")]:
        assert f"{setting}={value!r} with engine \"llamacpp\"" in refusal(**{**LLAMA, setting: value}), setting
    assert "MTP" in refusal(**LLAMA, speculative_method="mtp", num_speculative_tokens=2)
    for flag in ("--api-key", "--api-key-file", "--hf-token", "-hft"):
        assert "would put a secret" in refusal(**LLAMA, extra_engine_args=[flag, "x"]), flag
    for flag in ("--props", "--slot-save-path=/x", "--tools=all", "-ag", "--webui-mcp-proxy", "--gpt-oss-20b-default"):
        assert "remove it" in refusal(**LLAMA, extra_engine_args=[flag]), flag
    assert "LLAMA_ARG_ENDPOINT_PROPS" in refusal(**LLAMA, engine_env={"LLAMA_ARG_ENDPOINT_PROPS": "1"})
    assert "engine_env sets LLAMA_API_KEY" in refusal(**LLAMA, engine_env={"LLAMA_API_KEY": "x"})
    assert "`-zz` is not a flag of llama.cpp 11669" in refusal(**LLAMA, extra_engine_args=["-zz"])
    assert plan(**{**LLAMA, "model_files": None}).engine_args[1].endswith(UNRESOLVED_ENTRY)  # offline: unknown
    assert "has no GGUF model file" in refusal(**{**LLAMA, "model_files": ["*.safetensors"]})
    with pytest.raises(SettingsError) as err:
        resolved(["model.safetensors", "config.json"], **{**LLAMA, "model_files": None})
    assert "has no GGUF model file, and llama.cpp serves only GGUF" in "\n".join(err.value.problems)
    with pytest.raises(SettingsError) as err:
        resolved(["model.gguf"], engine="vllm")
    assert 'set engine = "llamacpp"' in "\n".join(err.value.problems)
    assert 'set engine_image = "ghcr.io/ggml-org/llama.cpp:server-cuda-b11669"' in refusal(
        **{**LLAMA, "engine_image": "lmsysorg/sglang:spark"})
    assert 'engine = "vllm"' in refusal(**LLAMA, tensor_parallel_hosts=["spark-a", "spark-b"])


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llamacpp"])
def test_the_key_is_never_in_the_unit_nor_the_args(engine):
    overrides = {"vllm": {}, "sglang": SGLANG, "llamacpp": LLAMA}[engine]
    p = plan(**overrides, api_key=KEY)
    assert KEY not in p.render_unit() and KEY not in " ".join(p.engine_args + p.docker_options)
    assert KEY not in str(p.to_dict())
    var = {"vllm": "VLLM_API_KEY", "sglang": None, "llamacpp": "LLAMA_API_KEY"}[engine]  # SGLang reads none
    assert (f"{var}={KEY}" in p.render_engine_env().splitlines()) if var else KEY not in p.render_engine_env()


def test_the_record_names_the_engine_and_its_previous_keeps_it():
    old = resolved(["model.safetensors", "config.json"]).release_record()
    new = resolved(["model.safetensors", "config.json", "extra.safetensors"], **SGLANG).release_record(old)
    assert old["engine"] == "vllm" and new["engine"] == "sglang" and new["previous"]["engine"] == "vllm"


def test_engine_for_follows_the_setting():
    assert engine_for(plan(**SGLANG).settings).name == "sglang"
