"""An engine's flag table (engines/<engine>-<version>.json, generated from the engine's own definitions):
which flags a pinned release accepts, which take a value, what each sets."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

ENGINES_DIR = Path(__file__).parent
REVIEW_FIX = ("remove it, or ask for it to be reviewed and added to the table's `reviewed` list (docs/settings.md, "
              "\"Engine flags by allow-list\")")
# What a reviewed value may be: (the pattern of one value, as a refusal names it). None: a switch, no value.
_NUMBER = r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?[kKmMgGtT]?"  # 8192, 0.7, -1, 16k (vLLM's human ints)
_WORD = r"[A-Za-z0-9][A-Za-z0-9_+-]*"
_INTERFACE = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}"  # a Linux interface name (IFNAMSIZ), as settings' InterfaceName
KINDS: dict[str, tuple[str | None, str] | None] = {
    "none": None, "number": (_NUMBER, "a number"), "word": (_WORD, "a name of letters, digits and _ + -"),
    "words": (rf"{_WORD}(?:,{_WORD})*", "names of letters, digits and _ + -, separated by commas"),
    "choice": (_WORD, "one of the flag's choices"), "json": (None, "a JSON object of names and numbers"),
    # the general engine_env variables' kinds (release/engines/environment.py), and the simulator's knobs'
    "count": (r"[1-9][0-9]{0,3}", "a whole number from 1 to 9999"),
    "indexes": (r"[0-9]{1,2}(?:,[0-9]{1,2})*", "device indexes separated by commas, such as 0 or 0,1"),
    "interfaces": (rf"[\^=]?{_INTERFACE}(?:,{_INTERFACE})*", "interface names of at most 15 letters, digits and "
                   "_ . : - separated by commas (^ or = first)"),
    "zone": (r"[A-Za-z][A-Za-z0-9_+-]*(?:/[A-Za-z0-9_+-]+){0,2}", "a time zone's name such as UTC or Europe/Berlin"),
    "knob": (r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,31}", "at most 32 letters, digits and _ . + - (a number or a word)")}
# A switch's value as an environment variable (llama.cpp reads LLAMA_ARG_X=1 as --x, =0 as its --no- form).
_SWITCH = r"(?i:1|0|true|false|on|off|enabled|disabled)"
# Where a value would load bytes sparkfleet did not pin and verify, in the order they are told apart.
_DESTINATIONS = [(re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://|(?i:https?|ftp|s3|gs|hf):"), "names a URL"),
                 (re.compile(r"[/~.]|.*\.py\b|.*\\"), "names a path"),
                 (re.compile(r"(?:[^=/]+=)?[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*"),
                  "names a hub repository"),
                 (re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+(?:[:.][A-Za-z_][A-Za-z0-9_]*)?"),
                  "names a Python class")]


def value_problem(value: str, kind: str, choices: Iterable[str] = ()) -> str | None:
    """Why a reviewed flag's value is refused (never quoting it: engine_env values are secrets), or None."""
    if kind == "json":
        try:
            data = json.loads(value)
        except ValueError:
            return "is not JSON"
        leaves = list(_leaves(data)) if isinstance(data, dict) else None
        bad = [why for leaf in leaves or () for why in [value_problem(leaf, "word")] if why]
        return ("is not a JSON object" if leaves is None else bad[0] if bad else None)
    choices = list(choices)
    if kind == "choice" and choices:
        return None if value in choices else f"is not one of {', '.join(choices)}"
    pattern, what = KINDS[kind] or (_SWITCH, "1 or 0")
    if pattern is not None and re.fullmatch(pattern, value):
        return None
    return next((why for destination, why in _DESTINATIONS if destination.match(value)), f"is not {what}")


def _leaves(data) -> Iterable[str]:
    """Every key and string of a JSON value (numbers, booleans and null pass)."""
    if isinstance(data, dict):
        for key, item in data.items():
            yield key
            yield from _leaves(item)
    elif isinstance(data, list):
        for item in data:
            yield from _leaves(item)
    elif isinstance(data, str):
        yield data


@dataclass(frozen=True)
class FlagTable:
    version: str
    entrypoint: tuple[str, ...]
    flags: dict
    removed: dict
    label: str = "vLLM"  # the engine as messages name it
    version_setting: str = "vllm_version"
    # The hand-kept review (the table's "reviewed"): {"flags": {flag: kind}, "env": {variable: kind}}, kinds of
    # KINDS. Nothing else passes extra_engine_args, and in engine_env nothing else but the few general variables of
    # release/engines/environment.py, so a flag a new release adds is refused until someone reads what it does.
    review: dict = field(default_factory=dict)
    KINDS = KINDS

    @property
    def reviewed(self) -> dict[str, str]:
        return self.review.get("flags", {})

    def canonical(self, flag: str) -> str:
        """The flag an alias spells (-hfd is --spec-draft-hf)."""
        return self.flags[flag].get("alias_of", flag)

    def reviewed_env(self) -> dict[str, tuple[str, list[str]]]:
        """{variable: (kind, choices)}: the table's reviewed variables and the env forms of its reviewed flags."""
        env: dict[str, tuple[str, list[str]]] = {var: (kind, []) for var, kind in self.review.get("env", {}).items()}
        env.update({spec["env"]: (self.reviewed[flag], spec.get("choices", []))
                    for flag, spec in self.flags.items() if flag in self.reviewed and spec.get("env")})
        return env

    def takes_value(self, flag: str, next_arg: str | None) -> bool:
        """Whether `flag` (written without =value) consumes the argument after it."""
        value = self.flags[flag].get("value")
        if value == "optional":  # llama.cpp's `-fa [on|off|auto]`: a value only when one of its choices follows
            return next_arg in self.flags[flag].get("choices", ())
        return bool(value)

    def problems(self, args: list[str]) -> list[str]:
        """Each flag in args that this engine version would refuse, with the fix."""
        found = []
        skip = False
        for i, arg in enumerate(args):
            if skip:
                skip = False
                continue
            if not arg.startswith("-"):
                continue
            flag, has_inline_value = arg.split("=", 1)[0], "=" in arg
            if flag in self.removed:
                found.append(f"`{flag}` does not exist in {self.label} {self.version}: {self.removed[flag]}")
            elif flag not in self.flags:
                found.append(f"`{flag}` is not a flag of {self.label} {self.version}: remove it or pin another "
                             f"{self.version_setting}")
            else:
                skip = not has_inline_value and self.takes_value(flag, args[i + 1] if i + 1 < len(args) else None)
        return found

    def unreviewed(self, args: list[str], refused: Callable[[str], bool]) -> list[str]:
        """Each argument sparkfleet has not reviewed: a flag off the reviewed list, a reviewed flag's value that is
        not of its kind, a value that follows no flag. `refused(flag)`: another check names this flag already
        (a secret, an admin surface, a setting's): its line is that check's. A --no- form passes where its flag
        is reviewed or refused (off is the default). Flags the table lacks are `problems`'."""
        found, i = [], 0
        while i < len(args):
            arg, i = args[i], i + 1
            if not arg.startswith("-"):
                found.append(f"extra_engine_args[{i - 1}] follows no flag that takes a value: remove it")
                continue
            if arg.split("=", 1)[0] not in self.flags:  # refused by `problems`; its value, if any, with it
                i += "=" not in arg and i < len(args) and not args[i].startswith("-")
                continue
            flag, inline = arg.split("=", 1) if "=" in arg else (arg, None)
            spec, canonical = self.flags[flag], self.canonical(flag)
            values = [inline] if inline is not None else []
            if inline is None and self.takes_value(flag, args[i] if i < len(args) else None):
                n = 1
                if spec.get("nargs") in ("+", "*"):
                    while i + n < len(args) and not args[i + n].startswith("-"):
                        n += 1
                values, i = args[i:i + n], i + n
            positive = spec.get("negates")
            if refused(flag) or (positive and (positive in self.reviewed or refused(positive))):
                continue
            if canonical not in self.reviewed:
                found.append(f"`{flag}` is not on sparkfleet's reviewed list for {self.label} {self.version}: "
                             f"{REVIEW_FIX}")
                continue
            kind = self.reviewed[canonical]
            for why in (value_problem(v, kind, spec.get("choices", ())) for v in values if kind != "none"):
                if why:
                    found.append(f"`{flag}`'s value {why}: sparkfleet passes only reviewed values, never a hub "
                                 f"repository, a URL, a path or a class (each would load unverified bytes): "
                                 f"set another value or remove the flag")
                    break
        return found

    def flag_env(self) -> dict[str, str]:
        """{variable: the flag it sets}: every variable the engine reads as a flag's value (llama.cpp's LLAMA_ARG_*,
        MTMD_BACKEND_DEVICE), each named after its first flag that is no --no- form, as the table spells it."""
        found: dict[str, str] = {}
        for flag, spec in self.flags.items():
            if spec.get("env") and not spec.get("negates"):
                found.setdefault(spec["env"], flag)
        return found

    def value_problem(self, flag: str, value: str, setting: str) -> str | None:
        """A setting's value that the flag's choices (or its known names) lack, naming them; None when known."""
        spec = self.flags.get(flag, {})
        known = spec.get("choices") or spec.get("known_values")
        if known and value not in known:
            return (f"{setting}={value!r} is not one of {self.label} {self.version}'s {flag} names "
                    f"({', '.join(known)}): set one of them")
        return None


def table_versions(engine: str) -> list[str]:
    return sorted(p.stem.removeprefix(f"{engine}-") for p in ENGINES_DIR.glob(f"{engine}-*.json"))


@lru_cache(maxsize=16)
def load_table(engine: str, version: str, label: str, version_setting: str) -> FlagTable:
    """engines/<engine>-<version>.json, or ValueError naming the versions there are."""
    path = ENGINES_DIR / f"{engine}-{version}.json"
    if not path.exists():
        raise ValueError(f"no flag table for {label} {version}: supported versions are "
                         f"{', '.join(table_versions(engine))}")
    data = json.loads(path.read_text())
    return FlagTable(data["version"], tuple(data.get("entrypoint", ())), data["flags"], data.get("removed", {}),
                     label, version_setting, data.get("reviewed", {}))
