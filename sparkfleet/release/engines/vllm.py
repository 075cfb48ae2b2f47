"""vLLM: `vllm serve MODEL_DIR --flag ...` (the image's entrypoint), the key from its descriptor's key_var in
engine.env."""

from __future__ import annotations

import json

from sparkfleet.contract import engines, paths
from sparkfleet.contract.settings import Service, Settings
from sparkfleet.release.engines.base import Engine
from sparkfleet.release.engines.table import FlagTable

# vLLM flags that carry a secret: on the command line it would sit in the world-readable unit and in `ps`.
SECRET_FLAGS = {
    "--api-key": f"set the `api_key` setting instead (it reaches vLLM as {engines.VLLM.key_var} from a root-only "
                 "env file)",
    "--hf-token": "remove it: the engine serves a local directory that sparkfleet fetched with `hub_token`",
}
# vLLM 0.33 flags that open an admin surface, load code, or log what users send (vllm/entrypoints/openai/cli_args.py,
# vllm/engine/arg_utils.py): refused in extra_engine_args. Their --no-/--disable- inverses stay allowed.
ADMIN_FLAGS = {
    "--enable-log-requests": "logs each request's prompt to the journal",
    "--enable-log-outputs": "logs each completion to the journal",
    "--profiler-config": "opens /start_profile and /stop_profile to whoever reaches the API",
    "--middleware": "imports and runs a Python class inside the API server",
    "--worker-extension-cls": "imports and runs a Python class inside every worker",
    "--allowed-local-media-path": "lets any API caller read files of the container through file:// media URLs",
    "--trust-request-chat-template": "lets any API caller send the chat template the server renders",
    "--config": "reads more flags from a file, past these checks",
}
# vLLM destinations sparkfleet sets from a setting: a second copy in extra_engine_args would silently win.
OWNED_DESTS = {
    "model": "model_repo", "served_model_name": "served_model_name", "host": "api_host", "port": "api_port",
    "max_model_len": "max_model_len", "gpu_memory_utilization": "gpu_memory_utilization",
    "kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "enable_prefix_caching": "enable_prefix_caching", "enable_auto_tool_choice": "enable_auto_tool_choice",
    "tool_call_parser": "tool_call_parser", "reasoning_parser": "reasoning_parser",
    "attention_backend": "attention_backend", "limit_mm_per_prompt": "limit_mm_per_prompt",
    "kv_cache_dtype": "kv_cache_dtype", "max_num_seqs": "max_num_seqs", "tensor_parallel_size": "tensor_parallel_size",
    "speculative_config": "speculative_method", "distributed_executor_backend": "tensor_parallel_hosts",
}

# How vLLM 0.33 serves each RAG kind (its pooling-models docs): a Qwen3ForCausalLM checkpoint is not a pooling
# model by itself, so `--runner auto` would generate; `--convert embed` makes it an embedding model. The
# reranker's recipe loads it as Qwen3ForSequenceClassification (hf_overrides), a pooling model already.
POOLING_ARGS = {"embedding": ("--runner", "pooling", "--convert", "embed"), "reranker": ("--runner", "pooling")}
# vLLM destinations a service's settings own: a copy in extra_engine_args would silently win.
SERVICE_DESTS = {"model": "`model_repo`", "served_model_name": "`served_model_name`", "host": "the host's `api_host`",
                 "port": "`api_port`", "max_model_len": "`max_model_len`",
                 "gpu_memory_utilization": "`gpu_memory_utilization`",
                 "kv_cache_memory_bytes": "`kv_cache_memory_bytes`", "runner": "the recipe's kind",
                 "convert": "the recipe's kind", "hf_overrides": "`hf_overrides`"}


def flag_name(arg: str) -> str:
    """The flag an argument names, as vLLM reads it: --trust_remote_code=1 is --trust-remote-code."""
    return "--" + arg.split("=", 1)[0].removeprefix("--").replace("_", "-")


def engine_args(s: Settings, model_dir: str) -> list[str]:
    """The argument list after the image name: `vllm serve MODEL --flag ...`."""
    args = [
        model_dir,
        "--served-model-name", s.served_model_name,
        "--host", paths.ENGINE_HOST,  # the host's guard answers on api_host:api_port
        "--port", str(paths.engine_port(s.api_port)),
        "--max-model-len", str(s.max_model_len),
        "--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}",
        *(["--kv-cache-memory-bytes", str(s.kv_cache_memory_bytes)] if s.kv_cache_memory_bytes else []),
        "--enable-prefix-caching" if s.enable_prefix_caching else "--no-enable-prefix-caching",
    ]
    if s.enable_auto_tool_choice:
        args.append("--enable-auto-tool-choice")
    if s.tool_call_parser:
        args += ["--tool-call-parser", s.tool_call_parser]
    if s.reasoning_parser:
        args += ["--reasoning-parser", s.reasoning_parser]
    if s.attention_backend:
        args += ["--attention-backend", s.attention_backend]
    if s.limit_mm_per_prompt:  # {} (a text-only model's recipe): no flag, which vLLM accepts for any model
        args += ["--limit-mm-per-prompt", json.dumps(s.limit_mm_per_prompt)]
    if s.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", s.kv_cache_dtype]
    if s.max_num_seqs:
        args += ["--max-num-seqs", str(s.max_num_seqs)]
    if s.tensor_parallel_size > 1:
        # one GPU per Spark: the other GPUs are the group's Ray nodes (vLLM's multi-node path)
        args += ["--tensor-parallel-size", str(s.tensor_parallel_size), "--distributed-executor-backend", "ray"]
    if s.speculative_method:
        # vLLM's SpeculativeConfig: "mtp" drafts with the checkpoint's own MTP layers (model left unset).
        args += ["--speculative-config", json.dumps({"method": s.speculative_method,
                                                     "num_speculative_tokens": s.num_speculative_tokens})]
    return args + list(s.extra_engine_args)


def service_args(kind: str, service: Service, model_dir: str) -> list[str]:
    """`vllm serve MODEL_DIR ...` of one RAG service: the host's listen address, the service's own port and share
    (release/services.py merged them: every required key set)."""
    name, port, share = service.served_model_name, service.api_port, service.gpu_memory_utilization
    assert name is not None and port is not None and share is not None, "a service's required keys"
    args = [model_dir, "--served-model-name", name, "--host", paths.ENGINE_HOST,
            "--port", str(paths.engine_port(port)), "--gpu-memory-utilization", f"{share:g}"]
    if service.kv_cache_memory_bytes:
        args += ["--kv-cache-memory-bytes", str(service.kv_cache_memory_bytes)]
    if service.max_model_len:
        args += ["--max-model-len", str(service.max_model_len)]
    args += POOLING_ARGS[kind]
    if service.hf_overrides:
        args += ["--hf-overrides", json.dumps(service.hf_overrides, sort_keys=True, separators=(",", ":"))]
    return args + list(service.extra_engine_args)


class Vllm(Engine):
    descriptor = engines.VLLM
    description = "vLLM OpenAI-compatible server"
    image = "vllm/vllm-openai:v0.33.0"
    secret_flags, admin_flags, owned_dests = SECRET_FLAGS, ADMIN_FLAGS, OWNED_DESTS
    env_prefixes = ("VLLM_",)  # the variables it reads (vllm/envs.py)
    pooling_args, service_dests = POOLING_ARGS, SERVICE_DESTS

    def flag_name(self, arg: str) -> str:
        return flag_name(arg)

    def args(self, s: Settings, model_dir: str, entry: str | None) -> list[str]:
        return engine_args(s, model_dir)

    def service_args(self, kind: str, service: Service, model_dir: str) -> list[str]:
        return service_args(kind, service, model_dir)


def flag_table(version: str) -> FlagTable:
    """vLLM's flag table of `version` (ValueError naming the supported ones)."""
    return Vllm().flag_table(version)
