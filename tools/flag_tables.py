"""The walk shared by the flag-table generators: every option string an argparse parser registered, as a table.

Each entry: "value" (takes a value), "choices", "known_values", "type", "default", "dest", "alias_of",
"negates" (a hidden inverse such as --no-X); the format of sparkfleet/release/engines/*.json.
"""

from __future__ import annotations

import argparse

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


def argparse_flags(parser: argparse.ArgumentParser, deprecated=frozenset()) -> dict[str, dict]:
    """{flag: entry} of every option string of `parser` (aliases and inverses included), sorted by flag."""
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
    return dict(sorted(flags.items()))
