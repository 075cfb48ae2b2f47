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

from sparkfleet.release.settings import Settings

ENGINES_DIR = Path(__file__).parent / "engines"


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
        "--host", s.api_host,
        "--port", str(s.api_port),
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
    if s.limit_mm_per_prompt is not None:
        args += ["--limit-mm-per-prompt", json.dumps(s.limit_mm_per_prompt)]
    if s.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", s.kv_cache_dtype]
    if s.max_num_seqs:
        args += ["--max-num-seqs", str(s.max_num_seqs)]
    if s.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(s.tensor_parallel_size)]
    return args + list(s.extra_engine_args)
