"""An engine's flag table (engines/<engine>-<version>.json, generated from the engine's own definitions):
which flags a pinned release accepts, which take a value, what each sets."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ENGINES_DIR = Path(__file__).parent


@dataclass(frozen=True)
class FlagTable:
    version: str
    entrypoint: tuple[str, ...]
    flags: dict
    removed: dict
    label: str = "vLLM"  # the engine as messages name it
    version_setting: str = "vllm_version"

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
                     label, version_setting)
