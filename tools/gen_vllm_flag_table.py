"""Regenerate vllm-<version>.json, the table of flags `vllm serve` accepts.

Run it with a Python where that vLLM release is importable (a scratch venv
with the vLLM wheel installed; no GPU is needed: the CPU platform is forced):

    python tools/gen_vllm_flag_table.py > sparkfleet/release/engines/vllm-X.Y.Z.json

It builds the real `vllm serve` argument parser and walks every option
string it registered (aliases and hidden `--no-*` / `--disable-*` inverses
included). The hand-kept parts (the "removed" flags and the notes) are taken
from the existing table of the same version, if there is one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PRIMITIVES = (str, int, float, bool, type(None))


def _type_name(action: argparse.Action) -> str | None:
    t = action.type
    if t is None:
        return None
    name = getattr(t, "__name__", type(t).__name__)
    # vLLM wraps types in closures (optional_type, parse_type); look inside.
    for cell in getattr(t, "__closure__", None) or ():
        inner = cell.cell_contents
        if callable(inner) and hasattr(inner, "__name__"):
            if getattr(inner, "__closure__", None):
                for c2 in inner.__closure__:
                    if callable(c2.cell_contents) and hasattr(c2.cell_contents, "__name__"):
                        return c2.cell_contents.__name__
            return inner.__name__
    return name


def _known_values(action: argparse.Action) -> list[str] | None:
    """Free-string flags whose metavar lists the names vLLM knows."""
    mv = action.metavar
    if isinstance(mv, str) and mv.startswith("{") and "}" in mv:
        return mv[1 : mv.index("}")].split(",")
    if isinstance(mv, (list, tuple)):
        return [str(v) for v in mv]
    return None


def build_table() -> dict:
    from vllm import __version__, platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms.current_platform = CpuPlatform()
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    deprecated = getattr(parser, "_deprecated", set())

    by_action: dict[int, list[str]] = {}
    actions: dict[int, argparse.Action] = {}
    for opt, action in parser._option_string_actions.items():
        if isinstance(action, argparse._HelpAction):
            continue
        by_action.setdefault(id(action), []).append(opt)
        actions[id(action)] = action

    flags: dict[str, dict] = {}
    for key, opts in by_action.items():
        action = actions[key]
        negative = set(getattr(action, "negative_option_strings", ()) or ())
        if isinstance(action, argparse.BooleanOptionalAction) and not negative:
            negative = {o for o in opts if o.startswith("--no-")}
        positive = [o for o in action.option_strings if o in opts and o not in negative]
        positive += [o for o in opts if o not in negative and o not in positive]
        longs = [o for o in positive if o.startswith("--")]
        canonical = longs[0] if longs else positive[0]

        entry: dict = {"value": action.nargs != 0}
        if isinstance(action, argparse.BooleanOptionalAction):
            entry["negatable"] = True
        if action.nargs not in (None, 0):
            entry["nargs"] = action.nargs
        if action.choices is not None:
            entry["choices"] = [str(c) for c in action.choices]
        known = _known_values(action)
        if known and "choices" not in entry:
            entry["known_values"] = known
            entry["free_string"] = True
        tname = _type_name(action)
        if tname and entry["value"]:
            entry["type"] = tname
        if isinstance(action, argparse._AppendAction):
            entry["append"] = True
        if isinstance(action.default, PRIMITIVES):
            entry["default"] = action.default
        elif isinstance(action.default, (list, dict)) and all(
            isinstance(v, PRIMITIVES) for v in action.default
        ):
            entry["default"] = action.default
        if action in deprecated or getattr(action, "deprecated", False):
            entry["deprecated"] = True
        entry["dest"] = action.dest
        flags[canonical] = entry
        for alias in positive:
            if alias != canonical:
                flags[alias] = dict(entry, alias_of=canonical)
        for neg in sorted(negative):
            flags[neg] = {"value": False, "negates": canonical, "dest": action.dest}

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
    }
    for flag in out["removed"]:
        if flag in out["flags"]:
            sys.exit(f"{flag} is listed as removed but vLLM {version} accepts it")
    json.dump(out, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
