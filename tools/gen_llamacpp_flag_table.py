"""Regenerate llamacpp-<build>.json, the table of flags `llama-server` accepts, from its own help text.

llama.cpp defines its flags in C++ (common/arg.cpp), so the table is read from what the binary prints:

    llama-server --help > help.txt; llama-server --version > version.txt
    python3 -m tools.gen_llamacpp_flag_table help.txt version.txt > sparkfleet/release/engines/llamacpp-BUILD.json

Each option line of the help lists the flag's spellings (`-c, --ctx-size N`), its value placeholder (none:
a switch; `[on|off|auto]`: an optional value; `{a,b}` or `<a|b>`: the choices), and on the lines below its
description the environment variable that sets it (`(env: LLAMA_ARG_CTX_SIZE)`). `--no-X` spellings are the
inverse of X.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

_OPTION = re.compile(r"-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*")
_ENV = re.compile(r"\(env: ([A-Z0-9_]+)\)")
_BUILD = re.compile(r"version: (?P<version>\S+) \(build (?P<build>[0-9]+)")


def _spec(head: str) -> tuple[list[str], str]:
    """(spellings, value placeholder) of an option line's left column."""
    names, value = [], ""
    for part in re.sub(r",\s+", ", ", head).split(", "):
        name, _, rest = part.strip().partition(" ")
        if _OPTION.fullmatch(name):
            names.append(name)
            value = rest.strip() or value
    return names, value


def _choices(value: str) -> tuple[bool | str, list[str] | None]:
    """("optional" / True / False, choices or None) of a value placeholder."""
    inner = re.fullmatch(r"[\[{<](.*)[\]}>]", value)
    choices = re.split(r"[|,]", inner[1]) if inner and re.search(r"[|,]", inner[1]) else None
    choices = [c for c in choices if re.fullmatch(r"[A-Za-z0-9_.-]+", c)] if choices else None
    if choices and any(c.isdigit() for c in choices) and "..." in value:
        choices = None  # a range such as <0...100>
    if not value:
        return False, None
    return ("optional" if value.startswith("[") else True), choices or None


def parse_help(text: str) -> dict[str, dict]:
    """{flag: entry} of every spelling in `llama-server --help` (entries as the other engines' tables)."""
    flags: dict[str, dict] = {}
    current: list[str] = []
    for line in text.splitlines():
        if line.startswith("-") and not line.startswith("-----"):
            head = re.split(r"\s{2,}(?=[^-\s])", re.sub(r",\s+", ", ", line), maxsplit=1)[0]
            names, value = _spec(head)
            if not names:
                continue
            takes, choices = _choices(value)
            negatives = [n for n in names if n.startswith(("--no-", "-no-"))]
            positives = [n for n in names if n not in negatives]
            if not positives:  # a switch that is itself named --no-X (--no-mmap): no inverse
                positives, negatives = negatives, []
            longs = [n for n in positives if n.startswith("--")]
            canonical = (longs or positives)[0]
            dest = canonical.lstrip("-").replace("-", "_")
            entry: dict = {"value": takes, **({"choices": choices} if choices else {}), "dest": dest}
            if negatives:
                entry["negatable"] = True
            flags[canonical] = entry
            for alias in (p for p in positives if p != canonical):
                flags[alias] = {**entry, "alias_of": canonical}
            for negative in negatives:
                flags[negative] = {"value": False, "negates": canonical, "dest": dest}
            current = [canonical]
        elif current and (env := _ENV.search(line)):
            for flag in (f for f, e in flags.items() if e["dest"] == flags[current[0]]["dest"]):
                flags[flag]["env"] = env[1]
    return dict(sorted(flags.items()))


def main() -> None:
    help_text = Path(sys.argv[1]).read_text()
    version_text = Path(sys.argv[2]).read_text()
    found = _BUILD.search(version_text)
    if not found:
        sys.exit(f"{sys.argv[2]}: no `version: X (build N` line: give `llama-server --version` output")
    old_path = Path(__file__).parents[1] / "sparkfleet" / "release" / "engines" / f"llamacpp-{found['build']}.json"
    old = json.loads(old_path.read_text()) if old_path.exists() else {}
    out = {
        "version": found["build"],
        "source": (f"`llama-server --help` of llama.cpp {found['version']} build {found['build']} "
                   f"({version_text.splitlines()[0].strip()}; Debian sid llama.cpp-tools), parsed by "
                   "tools/gen_llamacpp_flag_table.py: spellings, value placeholders, choices, env names. "
                   "Regenerate with gen_llamacpp_flag_table.py."),
        "entrypoint": ["llama-server"],
        "allow_abbrev": False,
        "notes": {"env": "llama-server also reads each flag from its LLAMA_ARG_* variable (entries' `env`)"},
        "flags": parse_help(help_text),
        "removed": {},
        "reviewed": old.get("reviewed", {}),  # hand-kept: the flags sparkfleet passes (docs/settings.md)
    }
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
