"""vLLM's names that the pooling services (release/services.py, always vLLM) import: every engine itself lives
behind one interface in sparkfleet/release/engines/."""

from __future__ import annotations

from sparkfleet.release.engines import FlagTable
from sparkfleet.release.engines.base import surface_problems as _surface_problems
from sparkfleet.release.engines.vllm import ADMIN_FLAGS, SECRET_FLAGS, Vllm, flag_name

__all__ = ["ADMIN_FLAGS", "SECRET_FLAGS", "flag_table", "surface_problems"]

_VLLM = Vllm()


def surface_problems(extra: list[str], remote_code: tuple[bool, bool]) -> list[str]:
    """vLLM's: flags of extra_engine_args that open an admin surface or run the hub's code."""
    return _surface_problems(extra, remote_code, ADMIN_FLAGS, flag_name)


def flag_table(version: str) -> FlagTable:
    """vLLM's flag table of `version` (ValueError naming the supported ones)."""
    return _VLLM.flag_table(version)
