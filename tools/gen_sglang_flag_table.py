"""Regenerate sglang-<version>.json, the table of flags `python3 -m sglang.launch_server` accepts.

SGLang's server needs torch, CUDA kernels and much more to import; its flags do not. Unpack the release
wheel (no dependencies) and point this tool at it, with only `msgspec` importable (SGLang's argument
records are msgspec structs):

    python3 -m pip download --no-deps sglang==0.5.23 -d /tmp/sg && unzip -q /tmp/sg/sglang-*.whl -d /tmp/sg/src
    python3 -m pip install --target /tmp/sg/pkgs msgspec
    PYTHONPATH=/tmp/sg/pkgs python3 -m tools.gen_sglang_flag_table /tmp/sg/src \
        > sparkfleet/release/engines/sglang-0.5.23.json

It runs the release's own `ServerArgs.add_cli_args` (sglang/srt/server_args.py and the field records of
sglang/srt/arg_groups/) on a fresh argparse parser and walks what it registered, like the vLLM tool. Every
other module those import (torch, the kernels, sglang's runtime) is replaced by an inert stand-in that only
carries the module's literal constants (read from its source): the flags, their values and their choices
come from SGLang's code, nothing is typed in by hand. The tool/reasoning parser choices are SGLang's own
dependency-free name lists (function_call/parser_names.py, parser/reasoning_parser_names.py).
"""

from __future__ import annotations

import abc
import argparse
import ast
import importlib.abc
import importlib.machinery
import json
import sys
import types
from pathlib import Path

from tools.flag_tables import argparse_flags

# Modules run for real: the argument definitions and the name lists they read.
REAL = ("sglang.srt.server_args", "sglang.srt.arg_groups", "sglang.srt.function_call.parser_names",
        "sglang.srt.parser.reasoning_parser_names", "sglang.kernels.ops.kv_canary.consts",
        "sglang.srt.model_executor.cuda_graph_config")
ALLOWED = {"msgspec", "typing_extensions"}  # third-party modules imported for real


class _Inert(abc.ABCMeta):
    """A stand-in class: any attribute, subscript or call gives a stand-in; a base class like any other."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Inert

    def __getitem__(cls, key):
        return Inert

    def __or__(cls, other):
        return Inert

    __ror__ = __or__

    def __iter__(cls):
        return iter(())


class Inert(metaclass=_Inert):
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):  # a decorator returns what it decorates
        return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else Inert()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Inert()

    def __getitem__(self, key):
        return Inert()

    def __iter__(self):
        return iter(())

    def __bool__(self):  # envs.X.get(), is_npu(), ...: off, as on a plain CUDA build
        return False


class _StandIn(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Inert


def _literals(source: Path) -> dict:
    """The module-level constants of a source file that are plain literals (lists of names, strings...)."""
    found = {}
    for node in ast.parse(source.read_text()).body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) and node.value else getattr(node, "targets", [])
        for target in targets:
            if isinstance(target, ast.Name):
                try:
                    found[target.id] = ast.literal_eval(node.value)
                except (ValueError, TypeError, SyntaxError, RecursionError):
                    pass
    return found


class StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports the REAL modules from the unpacked release, the packages above them bare (no __init__ runs),
    and a stand-in for everything else outside the standard library."""

    def __init__(self, src: Path):
        self.src = src

    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if name.startswith(REAL) or top in sys.stdlib_module_names or top in ALLOWED:
            return None
        if top == "sglang" and any(real.startswith(name + ".") for real in REAL):
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [str(self.src.joinpath(*name.split(".")))]
            return spec
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = _StandIn(spec.name)
        module.__path__, module.__file__ = [], "<stand-in>"
        base = self.src.joinpath(*spec.name.split("."))
        for source in (base.with_suffix(".py"), base / "__init__.py"):
            if source.is_file():
                module.__dict__.update(_literals(source))
        return module

    def exec_module(self, module):
        pass


def build_table(src: Path) -> dict:
    sys.path.insert(0, str(src))
    sys.meta_path.insert(0, StandIns(src))
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")  # what prepare_server_args builds
    ServerArgs.add_cli_args(parser)
    version = _literals(src / "sglang" / "_version.py")["__version__"]  # setuptools-scm writes it in the wheel
    empty = [action.option_strings[0] for action in parser._actions if action.choices is not None
             and not list(action.choices)]
    if empty:
        sys.exit(f"no choices were read for {', '.join(empty)}: a stand-in hid them; import their module for real")
    flags = argparse_flags(parser)
    for spec in flags.values():
        if spec.get("type") == Inert.__name__:  # a stand-in parser (human_readable_int...): its name is unknown
            del spec["type"]
    return {"version": version, "flags": flags, "allow_abbrev": parser.allow_abbrev}


def main() -> None:
    src = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    table = build_table(src)
    version = table["version"]
    old_path = Path(__file__).parents[1] / "sparkfleet" / "release" / "engines" / f"sglang-{version}.json"
    old = json.loads(old_path.read_text()) if old_path.exists() else {}
    out = {
        "version": version,
        "source": (f"sgl-project/sglang {version} (release wheel, no dependencies): the parser "
                   "sglang/srt/server_args.py prepare_server_args builds, ServerArgs.add_cli_args over the field "
                   "records of sglang/srt/arg_groups/fields/, run by tools/gen_sglang_flag_table.py with inert "
                   "stand-ins for torch and the runtime; parser choices from function_call/parser_names.py and "
                   "parser/reasoning_parser_names.py. Entrypoint: `python3 -m sglang.launch_server` "
                   "(sglang/launch_server.py). Regenerate with gen_sglang_flag_table.py."),
        "entrypoint": ["python3", "-m", "sglang.launch_server"],
        "allow_abbrev": table["allow_abbrev"],
        "notes": old.get("notes", {}),
        "flags": table["flags"],
        "removed": old.get("removed", {}),
        "reviewed": old.get("reviewed", {}),  # hand-kept: the flags sparkfleet passes (docs/settings.md)
    }
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
