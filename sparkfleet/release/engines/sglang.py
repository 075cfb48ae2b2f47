"""SGLang: `python3 -m sglang.launch_server --model-path DIR ...` (the image has no serving entrypoint).

The API key: SGLang 0.5.23 reads it only from --api-key (no environment variable; sglang/srt/environ.py has
none), and a `--config` YAML file would keep it off the command line, but the server logs every resolved
argument at start-up, the key included (sglang/srt/entrypoints/engine.py `server_args=` through
resolved_dict; only watermark secrets are redacted), so the key would land in the journal. SGLang is
therefore started with no key: it listens on 127.0.0.1 only, and the host's guard in front demands the
backend key on every path but /health. engine.env carries no key (the descriptor's key_var is None): the host's
helpers ask SGLang on loopback without one.
"""

from __future__ import annotations

from sparkfleet.contract import engines, paths
from sparkfleet.contract.settings import Settings
from sparkfleet.release.engines.base import Engine
from sparkfleet.release.engines.table import FlagTable

SECRET_FLAGS = {
    "--api-key": "set the `api_key` setting instead: the host's guard demands it in front of SGLang, which is "
                 "started without one because it logs its arguments (the key among them) at start-up",
    "--admin-api-key": "remove it: SGLang's admin endpoints stay closed without it",
    "--ssl-keyfile-password": "remove it: the engine listens on loopback, TLS is the front door's",
}
# SGLang 0.5.23 flags that run code, read more flags past these checks, or write users' text to disk or logs.
ADMIN_FLAGS = {
    "--config": "reads more flags from a file, past these checks",
    "--enable-custom-logit-processor": "lets any API caller send a pickled logit processor, which runs code in "
                                       "the server",
    "--custom-weight-loader": "imports and runs a Python function inside the server",
    "--log-requests": "logs each request's inputs and outputs to the journal",
    "--crash-dump-folder": "writes the requests of the last minutes to disk on a crash",
    "--debug-tensor-dump-output-folder": "writes the model's activations for users' requests to disk",
}
# SGLang destinations sparkfleet sets from a setting (sglang/srt/arg_groups/fields/).
OWNED_DESTS = {
    "model_path": "model_repo", "served_model_name": "served_model_name", "host": "api_host", "port": "api_port",
    "context_length": "max_model_len", "mem_fraction_static": "gpu_memory_utilization",
    "tool_call_parser": "tool_call_parser", "reasoning_parser": "reasoning_parser",
    "attention_backend": "attention_backend", "kv_cache_dtype": "kv_cache_dtype",
    "max_running_requests": "max_num_seqs", "tp_size": "tensor_parallel_size",
    "disable_radix_cache": "enable_prefix_caching", "speculative_algorithm": "speculative_method",
}
MODULE = ("-m", "sglang.launch_server")  # after `--entrypoint python3`


class SGLang(Engine):
    descriptor = engines.SGLANG
    description = "SGLang server"
    image = "lmsysorg/sglang:spark"  # NVIDIA's Spark playbook image: a moving tag, pinned by digest at plan time
    secret_flags, admin_flags, owned_dests = SECRET_FLAGS, ADMIN_FLAGS, OWNED_DESTS
    env_prefixes = ("SGLANG_", "SGL_")  # the variables it reads (sglang/srt/environ.py)
    command = MODULE

    def docker_options(self, s: Settings) -> list[str]:
        return ["--entrypoint", "python3"]

    def args(self, s: Settings, model_dir: str, entry: str | None) -> list[str]:
        args = [*MODULE, "--model-path", model_dir, "--served-model-name", s.served_model_name,
                "--host", paths.ENGINE_HOST, "--port", str(paths.engine_port(s.api_port)),
                "--context-length", str(s.max_model_len),
                "--mem-fraction-static", f"{s.gpu_memory_utilization:g}", "--enable-metrics"]
        if not s.enable_prefix_caching:
            args.append("--disable-radix-cache")
        if s.tool_call_parser:
            args += ["--tool-call-parser", s.tool_call_parser]
        if s.reasoning_parser:
            args += ["--reasoning-parser", s.reasoning_parser]
        if s.attention_backend:
            args += ["--attention-backend", s.attention_backend]
        if s.kv_cache_dtype != "auto":
            args += ["--kv-cache-dtype", s.kv_cache_dtype]
        if s.max_num_seqs:
            args += ["--max-running-requests", str(s.max_num_seqs)]
        return args + list(s.extra_engine_args)

    def engine_problems(self, name: str, s: Settings, table: FlagTable) -> list[str]:
        checks = [("--tool-call-parser", s.tool_call_parser, "tool_call_parser"),
                  ("--reasoning-parser", s.reasoning_parser, "reasoning_parser"),
                  ("--attention-backend", s.attention_backend, "attention_backend"),
                  ("--kv-cache-dtype", s.kv_cache_dtype if s.kv_cache_dtype != "auto" else None, "kv_cache_dtype")]
        problems = [f"{name}: {p}" for flag, value, setting in checks if value
                    for p in [table.value_problem(flag, value, setting)] if p]
        if s.kv_cache_memory_bytes:
            problems.append(f"{name}: kv_cache_memory_bytes={s.kv_cache_memory_bytes}: sparkfleet plans a fixed KV "
                            f"cache for vLLM only (SGLang sizes its pool from gpu_memory_utilization's share): set "
                            f"kv_cache_memory_bytes = None, or engine = \"vllm\"")
        if s.speculative_method:
            problems.append(f"{name}: speculative_method={s.speculative_method!r}: sparkfleet drives MTP drafting "
                            f"through vLLM only: remove speculative_method and num_speculative_tokens, or set "
                            f"engine = \"vllm\"")
        return problems
