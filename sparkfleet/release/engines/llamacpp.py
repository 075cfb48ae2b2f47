"""llama.cpp: `llama-server -m MODEL_DIR/ENTRY.gguf ...` (the image's entrypoint), the key from LLAMA_API_KEY
in engine.env (llama-server reads it: `--api-key`'s env), never the command line."""

from __future__ import annotations

import re

from sparkfleet.contract import engines, paths
from sparkfleet.contract.settings import Settings
from sparkfleet.release.engines.base import Engine
from sparkfleet.release.engines.table import FlagTable

# Offline (no manifest) and no literal .gguf name in model_files: the file the hub's listing will name.
UNRESOLVED_ENTRY = "UNRESOLVED-see-model_files.gguf"
GPU_LAYERS = "999"  # every layer on the GPU: a Spark's memory is the GPU's

SECRET_FLAGS = {
    "--api-key": f"set the `api_key` setting instead (it reaches llama-server as {engines.LLAMACPP.key_var} from a "
                 "root-only env file)",
    "--api-key-file": "set the `api_key` setting instead: sparkfleet writes the key into a root-only env file",
    "--hf-token": "remove it: the engine serves a local file that sparkfleet fetched with `hub_token`",
}
# llama-server flags that open an admin or agent surface, read files for callers, download models or log
# users' text (from its --help): refused in extra_engine_args and as their LLAMA_ARG_* in engine_env.
ADMIN_FLAGS = {
    "--props": "lets any API caller change the server's global properties (POST /props)",
    "--slot-save-path": "lets any API caller save and restore KV-cache slots as files on disk",
    "--tools": "gives AI agents built-in tools that read, write and run commands in the container",
    "--tools-runtime": "runs the agents' tools in other containers or over SSH",
    "--agent": "turns on the CORS proxy and every built-in tool",
    "--ui-mcp-proxy": "opens an MCP CORS proxy: the server fetches URLs for whoever reaches it",
    "--mcp-servers-config": "starts MCP servers from a file",
    "--mcp-servers-json": "starts MCP servers",
    "--media-path": "lets any API caller read files of a directory through file:// URLs",
    "--path": "serves the files of a directory of the container",
    "--log-prompts-dir": "writes every prompt to disk",
    "--models-dir": "turns the server into a router that loads other models",
    "--models-preset": "turns the server into a router that loads other models",
    "--rpc": "sends the model's work to other hosts' RPC servers",
    "--hf-repo": "downloads a model from the hub, past sparkfleet's pinned and verified files",
    "--model-url": "downloads a model from a URL, past sparkfleet's pinned and verified files",
    "--docker-repo": "downloads a model from a registry, past sparkfleet's pinned and verified files",
}
# llama-server's preset flags (--gpt-oss-120b-default, --fim-qwen-7b-spec, ...) download their model from the hub.
PRESET = re.compile(r"--[a-z0-9.-]+-(default|spec)")
OWNED_DESTS = {
    "model": "model_repo", "alias": "served_model_name", "host": "api_host", "port": "api_port",
    "ctx_size": "max_model_len", "gpu_layers": "(every layer on the GPU)", "parallel": "max_num_seqs",
    "cache_prompt": "enable_prefix_caching", "metrics": "(always on)", "jinja": "(always on)",
}


class LlamaCpp(Engine):
    descriptor = engines.LLAMACPP
    description = "llama.cpp llama-server"
    image = "ghcr.io/ggml-org/llama.cpp:server-cuda-b11669"  # ggml-org's CUDA server of that build (llama-server)
    secret_flags, admin_flags, owned_dests = SECRET_FLAGS, ADMIN_FLAGS, OWNED_DESTS
    env_prefixes = ("LLAMA_ARG_",)  # llama-server reads each flag from its LLAMA_ARG_* variable

    def refuses(self, table: FlagTable, flag: str) -> bool:
        """Also a preset, which extra_problems names."""
        return super().refuses(table, flag) or bool(PRESET.fullmatch(flag))

    def args(self, s: Settings, model_dir: str, entry: str | None) -> list[str]:
        args = ["-m", f"{model_dir}/{entry or UNRESOLVED_ENTRY}", "--alias", s.served_model_name,
                "--host", paths.ENGINE_HOST, "--port", str(paths.engine_port(s.api_port)),
                "-c", str(s.max_model_len), "-ngl", GPU_LAYERS, "--jinja", "--metrics"]
        if s.max_num_seqs:
            args += ["--parallel", str(s.max_num_seqs)]
        if not s.enable_prefix_caching:
            args.append("--no-cache-prompt")
        return args + list(s.extra_engine_args)

    def extra_problems(self, table: FlagTable, extra: list[str]) -> list[str]:
        """Also: an alias of an admin flag (`-ag`, `--webui-mcp-proxy`) is refused as the flag."""
        found = super().extra_problems(table, extra)
        for arg in extra:
            spec = table.flags.get(arg.split("=", 1)[0], {}) if arg.startswith("-") else {}
            if PRESET.fullmatch(arg) and arg in table.flags:
                found.append(f"setting `extra_engine_args`: `{arg}` serves a preset model that llama-server "
                             "downloads, past sparkfleet's pinned and verified files: remove it")
            if spec.get("alias_of") in self.admin_flags:
                found.append(f"setting `extra_engine_args`: `{arg.split('=', 1)[0]}` is "
                             f"{spec['alias_of']}, which {self.admin_flags[spec['alias_of']]}: remove it")
        return found

    def engine_problems(self, name: str, s: Settings, table: FlagTable) -> list[str]:
        fixes = {"tool_call_parser": (s.tool_call_parser, "llama-server parses tool calls from the chat template "
                                      "(--jinja): set tool_call_parser = None and enable_auto_tool_choice = False"),
                 "reasoning_parser": (s.reasoning_parser, "llama-server extracts reasoning itself: set "
                                      "reasoning_parser = None"),
                 "speculative_method": (s.speculative_method, "sparkfleet drives MTP drafting through vLLM only: "
                                        "remove speculative_method and num_speculative_tokens"),
                 "limit_mm_per_prompt": (s.limit_mm_per_prompt, "llama-server has no such limit: set "
                                         "limit_mm_per_prompt = None"),
                 "attention_backend": (s.attention_backend, "llama-server has no such choice (flash attention: "
                                       "-fa in extra_engine_args): set attention_backend = None"),
                 "kv_cache_memory_bytes": (s.kv_cache_memory_bytes, "llama-server's KV cache is its context: set "
                                           "max_model_len (its -c) and kv_cache_memory_bytes = None"),
                 "kv_cache_dtype": (s.kv_cache_dtype if s.kv_cache_dtype != "auto" else None,
                                    "llama-server names its cache types otherwise (-ctk/-ctv in extra_engine_args): "
                                    "set kv_cache_dtype = \"auto\"")}
        return [f"{name}: {setting}={value!r} with engine \"llamacpp\": {fix}"
                for setting, (value, fix) in fixes.items() if value]
