"""The engine's command line (one interface for every engine: sparkfleet/release/engines/), and vLLM's names
that the pooling services (release/services.py, always vLLM) and older callers import from here."""

from __future__ import annotations

from sparkfleet.release.engines import ENGINES_DIR, Engine, FlagTable, engine_for, gguf_entry, is_gguf_model
from sparkfleet.release.engines.base import surface_problems as _surface_problems
from sparkfleet.release.engines.vllm import ADMIN_FLAGS, OWNED_DESTS, SECRET_FLAGS, Vllm, engine_args, flag_name

__all__ = ["ENGINES_DIR", "Engine", "FlagTable", "engine_for", "gguf_entry", "is_gguf_model", "ADMIN_FLAGS",
           "OWNED_DESTS", "SECRET_FLAGS", "engine_args", "flag_name", "flag_table", "supported_versions",
           "surface_problems"]

_VLLM = Vllm()


def surface_problems(extra: list[str], remote_code: tuple[bool, bool]) -> list[str]:
    """vLLM's: flags of extra_engine_args that open an admin surface or run the hub's code."""
    return _surface_problems(extra, remote_code, ADMIN_FLAGS, flag_name)


def supported_versions() -> list[str]:
    return _VLLM.supported_versions()


def flag_table(version: str) -> FlagTable:
    """vLLM's flag table of `version` (ValueError naming the supported ones)."""
    return _VLLM.flag_table(version)
