"""vLLM's command line: build it from settings, check it against the pinned version.

The flag table of each supported vLLM release lives in sparkfleet/release/engines/
(read from vLLM's own argument definitions), so a deploy emits only flags
that the pinned image accepts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from sparkfleet.contract import paths
from sparkfleet.contract.formats import API_KEY_VAR
from sparkfleet.contract.settings import Settings

ENGINES_DIR = Path(__file__).parent / "engines"

# vLLM flags that carry a secret: on the command line it would sit in the world-readable unit and in `ps`.
SECRET_FLAGS = {
    "--api-key": f"set the `api_key` setting instead (it reaches vLLM as {API_KEY_VAR} from a root-only env file)",
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
TRUST_REMOTE_CODE = "--trust-remote-code"


def flag_name(arg: str) -> str:
    """The flag an argument names, as vLLM reads it: --trust_remote_code=1 is --trust-remote-code."""
    return "--" + arg.split("=", 1)[0].removeprefix("--").replace("_", "-")


def surface_problems(extra: list[str], remote_code: tuple[bool, bool]) -> list[str]:
    """Flags of extra_engine_args that open an admin surface or run the hub's code, each with why and the fix.

    `remote_code`: (the recipe says `trust_remote_code = true`, the user set `allow_trust_remote_code`);
    --trust-remote-code runs the model repository's Python as root in the container, so it needs both.
    """
    found = []
    for arg in extra:
        flag = flag_name(arg) if arg.startswith("--") else None
        if flag in ADMIN_FLAGS:
            found.append(f"`{flag}` {ADMIN_FLAGS[flag]}: remove it")
        elif flag == TRUST_REMOTE_CODE and not all(remote_code):
            missing = [what for what, ok in zip(("the recipe does not say `trust_remote_code = true`",
                                                 "`allow_trust_remote_code` is not True"), remote_code) if not ok]
            found.append(f"`{flag}` runs the model repository's Python as root in the engine container, and "
                         f"{' and '.join(missing)}: remove it, or serve a recipe that needs it and set "
                         f"allow_trust_remote_code = True to accept that risk")
    return found


# vLLM destinations sparkfleet sets from a setting: a second copy in extra_engine_args would silently win.
OWNED_DESTS = {
    "model": "model_repo", "served_model_name": "served_model_name", "host": "api_host", "port": "api_port",
    "max_model_len": "max_model_len", "gpu_memory_utilization": "gpu_memory_utilization",
    "enable_prefix_caching": "enable_prefix_caching", "enable_auto_tool_choice": "enable_auto_tool_choice",
    "tool_call_parser": "tool_call_parser", "reasoning_parser": "reasoning_parser",
    "attention_backend": "attention_backend", "limit_mm_per_prompt": "limit_mm_per_prompt",
    "kv_cache_dtype": "kv_cache_dtype", "max_num_seqs": "max_num_seqs", "tensor_parallel_size": "tensor_parallel_size",
    "speculative_config": "speculative_method", "distributed_executor_backend": "tensor_parallel_hosts",
}


@dataclass(frozen=True)
class FlagTable:
    version: str
    entrypoint: tuple[str, ...]
    flags: dict
    removed: dict

    def problems(self, args: list[str]) -> list[str]:
        """Each flag in args that this vLLM version would refuse, with the fix."""
        found = []
        expect_value = False
        for arg in args:
            if expect_value:
                expect_value = False
                continue
            if not arg.startswith("-"):
                continue
            flag, has_inline_value = arg.split("=", 1)[0], "=" in arg
            if flag in self.removed:
                found.append(f"`{flag}` does not exist in vLLM {self.version}: {self.removed[flag]}")
            elif flag not in self.flags:
                found.append(f"`{flag}` is not a flag of vLLM {self.version}: remove it or pin another vllm_version")
            else:
                spec = self.flags[flag]
                expect_value = bool(spec.get("value")) and not has_inline_value
        return found

    def extra_problems(self, extra: list[str]) -> list[str]:
        """Flags of extra_engine_args that carry a secret or that a setting owns, each with the fix.

        Only flag names are reported, never the values that follow them.
        """
        found = []
        for arg in extra:
            if not arg.startswith("-"):
                continue
            flag = arg.split("=", 1)[0]
            named = "--" + flag.removeprefix("--").replace("_", "-")  # vLLM reads --api_key as --api-key
            owner = OWNED_DESTS.get(self.flags.get(flag, {}).get("dest"))
            if named in SECRET_FLAGS:
                found.append(f"setting `extra_engine_args`: `{flag}` would put a secret in the world-readable unit: "
                             f"{SECRET_FLAGS[named]}")
            elif owner:
                found.append(f"setting `extra_engine_args`: `{flag}` is set by sparkfleet from `{owner}`: "
                             f"set `{owner}` instead")
        return found


def supported_versions() -> list[str]:
    return sorted(p.stem.removeprefix("vllm-") for p in ENGINES_DIR.glob("vllm-*.json"))


@lru_cache(maxsize=8)
def flag_table(version: str) -> FlagTable:
    path = ENGINES_DIR / f"vllm-{version}.json"
    if not path.exists():
        raise ValueError(
            f"no flag table for vLLM {version}: supported versions are {', '.join(supported_versions())}"
        )
    data = json.loads(path.read_text())
    return FlagTable(data["version"], tuple(data.get("entrypoint", ["vllm", "serve"])),
                     data["flags"], data.get("removed", {}))


def engine_args(s: Settings, model_dir: str) -> list[str]:
    """The argument list after the image name: `vllm serve MODEL --flag ...`."""
    args = [
        model_dir,
        "--served-model-name", s.served_model_name,
        "--host", paths.ENGINE_HOST,  # the host's guard answers on api_host:api_port
        "--port", str(paths.engine_port(s.api_port)),
        "--max-model-len", str(s.max_model_len),
        "--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}",
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
