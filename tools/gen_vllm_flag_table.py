"""Regenerate vllm-<version>.json, the table of flags `vllm serve` accepts.

Run it with a Python where that vLLM release is importable (a scratch venv
with the vLLM wheel installed; no GPU is needed: the CPU platform is forced):

    python -m tools.gen_vllm_flag_table > sparkfleet/release/engines/vllm-X.Y.Z.json

It builds the real `vllm serve` argument parser and walks every option
string it registered (aliases and hidden `--no-*` / `--disable-*` inverses
included). The hand-kept parts (the "removed" flags and the notes) are taken
from the existing table of the same version, if there is one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tools.flag_tables import argparse_flags


def build_table() -> dict:
    from vllm import __version__, platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms.current_platform = CpuPlatform()
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    deprecated = getattr(parser, "_deprecated", set())

    flags = argparse_flags(parser, deprecated)

    # Free strings that vLLM checks only at start-up, against registries.
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    startup_checked = {
        "--tool-call-parser": sorted(ToolParserManager.list_registered()),
        "--reasoning-parser": sorted(ReasoningParserManager.list_registered()),
        "--attention-backend": ["auto", *AttentionBackendEnum.__members__],
    }
    for flag, values in startup_checked.items():
        if flag in flags:
            flags[flag]["known_values"] = values
            flags[flag]["free_string"] = True
            flags[flag]["checked_at_startup"] = True

    return {
        "version": __version__,
        "flags": dict(sorted(flags.items())),
        "allow_abbrev": parser.allow_abbrev,
    }


def main() -> None:
    table = build_table()
    version = table["version"]
    old_path = Path(__file__).with_name(f"vllm-{version}.json")
    old = json.loads(old_path.read_text()) if old_path.exists() else {}
    out = {
        "version": version,
        "source": old.get("source", f"vllm {version}"),
        "entrypoint": old.get("entrypoint", ["vllm", "serve"]),
        "allow_abbrev": table["allow_abbrev"],
        "notes": old.get("notes", {}),
        "flags": table["flags"],
        "removed": old.get("removed", {}),
        "reviewed": old.get("reviewed", {}),  # hand-kept: the flags sparkfleet passes (docs/settings.md)
    }
    for flag in out["removed"]:
        if flag in out["flags"]:
            sys.exit(f"{flag} is listed as removed but vLLM {version} accepts it")
    json.dump(out, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
