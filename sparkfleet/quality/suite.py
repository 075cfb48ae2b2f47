"""The probe suite: a TOML file of probes (docs/quality.md gives its format), read and checked here.

`load_suite(None)` reads the packaged default (suite.toml beside this module); an office's own file is read the same
way. Every problem is one `SuiteError` line naming the file, the probe and the fix, before any host is asked."""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkfleet.quality import schema as schemas
from sparkfleet.refused import Refusal

DEFAULT_SUITE = Path(__file__).with_name("suite.toml")
KINDS = frozenset({"exact", "tool_call", "tool_parallel", "tool_round_trip", "json_schema", "format", "needle",
                   "multi_turn", "embedding", "rerank"})
SERVES = ("chat", "embedding", "rerank")
DEFAULT_REPEATS = 3
MAX_REPEATS = 10
# What a request adds to a probe's own text in tokens, for the fit against a model's context: the chat template's
# markup and a tool schema's rendering are estimated from characters (CHARS_PER_TOKEN), plus this margin.
TEMPLATE_TOKENS = 64
CHARS_PER_TOKEN = 3
# The needle's filler holds this many words per token of context_tokens: a tokenizer of up to 1/0.6 tokens per
# English word (the usual ones take 1.2-1.4) stays within context_tokens.
FILLER_WORDS_PER_TOKEN = 0.6
ID = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
DEFAULT_MAX_TOKENS = {"exact": 24, "tool_call": 96, "tool_parallel": 192, "tool_round_trip": 48, "json_schema": 96,
                      "format": 48, "needle": 24, "multi_turn": 32, "embedding": 0, "rerank": 0}


class SuiteError(ValueError, Refusal):
    """A suite file that cannot be used: one line naming the file, the probe and the fix (exit 2)."""


@dataclass(frozen=True)
class Probe:
    """One probe; which fields matter depends on `kind` (docs/quality.md)."""

    id: str
    kind: str
    serves: str = "chat"
    prompt: str = ""
    system: str = ""
    max_tokens: int = 0
    tools: tuple[Mapping[str, Any], ...] = ()  # OpenAI tool definitions ({"type": "function", "function": {...}})
    calls: int = 0  # tool_parallel: calls expected at least
    tool: str = ""  # tool_round_trip: the tool whose result is given back
    arguments: Mapping[str, Any] = field(default_factory=dict)  # tool_round_trip: the call's arguments
    result: str = ""  # tool_round_trip: the tool's result
    expect: str = ""  # tool_round_trip: what the answer must hold (the result's value)
    schema: Mapping[str, Any] | None = None  # json_schema
    lines: int | None = None  # format: exactly this many non-empty lines
    max_words: int | None = None
    max_chars: int | None = None
    regex: str | None = None  # format and multi_turn: re.search on the (stripped) answer
    no_fences: bool = True  # format: no ``` in the answer
    context_tokens: int = 0  # needle: the filler's size
    depth: float = 0.5  # needle: where in the filler (0 first, 1 last)
    needle: str = ""  # needle: the token to quote (derived from the id when empty)
    turns: tuple[str, ...] = ()  # multi_turn: the user's turns
    anchor: str = ""  # embedding
    similar: str = ""
    unrelated: tuple[str, ...] = ()
    query: str = ""  # rerank
    documents: tuple[str, ...] = ()
    relevant: int = 0

    def tokens(self) -> int:
        """The context this probe needs, in tokens (an estimate from characters, the needle's context_tokens)."""
        if self.kind == "needle":
            return self.context_tokens + self.max_tokens + TEMPLATE_TOKENS
        text = [self.prompt, self.system, self.result, *self.turns, self.anchor, self.similar, *self.unrelated,
                self.query, *self.documents, repr(list(self.tools)), repr(self.schema or {})]
        # multi_turn: every earlier answer stays in the context
        answers = self.max_tokens * max(len(self.turns) - 1, 0)
        return sum(len(t) for t in text) // CHARS_PER_TOKEN + self.max_tokens + answers + TEMPLATE_TOKENS

    def needle_token(self) -> str:
        """The needle: the probe's own, or a random-looking one derived from its id (the same every run)."""
        if self.needle:
            return self.needle
        digest = hashlib.sha256(self.id.encode()).hexdigest().upper()
        return f"{digest[:4]}-{digest[4:8]}".replace("0", "Q").replace("1", "Z")


@dataclass(frozen=True)
class Suite:
    probes: tuple[Probe, ...]
    repeats: int = DEFAULT_REPEATS
    source: str = "the default suite"

    def serving(self, serves: str) -> tuple[Probe, ...]:
        return tuple(p for p in self.probes if p.serves == serves)


# Per kind: the fields it requires and those it may have (beyond id, kind, serves, max_tokens).
FIELDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "exact": (frozenset({"prompt"}), frozenset({"system"})),
    "tool_call": (frozenset({"prompt", "tools"}), frozenset({"system"})),
    "tool_parallel": (frozenset({"prompt", "tools"}), frozenset({"system", "calls"})),
    "tool_round_trip": (frozenset({"prompt", "tools", "result"}), frozenset({"system", "tool", "arguments", "expect"})),
    "json_schema": (frozenset({"prompt", "schema"}), frozenset({"system"})),
    "format": (frozenset({"prompt"}), frozenset({"system", "lines", "max_words", "max_chars", "regex", "no_fences"})),
    "needle": (frozenset({"context_tokens"}), frozenset({"depth", "needle"})),
    "multi_turn": (frozenset({"system", "turns", "regex"}), frozenset()),
    "embedding": (frozenset({"anchor", "similar", "unrelated"}), frozenset()),
    "rerank": (frozenset({"query", "documents"}), frozenset({"relevant"})),
}
COMMON = frozenset({"id", "kind", "serves", "max_tokens"})


def _fail(source: str, probe: str, problem: str, fix: str) -> SuiteError:
    return SuiteError(f"{source}: {probe}: {problem}: {fix}")


def _text(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != ""


def _count(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _tool(raw: Any) -> dict | None:
    """A tool table ({name, description, parameters}) as OpenAI's definition, or None when it is not one."""
    if not isinstance(raw, dict) or not _text(raw.get("name")) or set(raw) - {"name", "description", "parameters"}:
        return None
    function = {"name": raw["name"], "description": str(raw.get("description", "")),
                "parameters": raw.get("parameters", {"type": "object", "properties": {}})}
    return {"type": "function", "function": function}


def _probe(raw: Any, source: str, index: int) -> Probe:
    if not isinstance(raw, dict):
        raise _fail(source, f"probe {index + 1}", "not a table", "write each probe as a [[probe]] table")
    pid = raw.get("id")
    if not isinstance(pid, str) or not ID.fullmatch(pid):
        raise _fail(source, f"probe {index + 1}", f"id {pid!r} is missing or not a name",
                    "give it id = \"...\" of lower-case letters, digits, _ . - (at most 64)")
    name = f"probe {pid}"
    kind = raw.get("kind")
    if kind not in KINDS:
        raise _fail(source, name, f"unknown kind {kind!r}", f"use one of {', '.join(sorted(KINDS))}")
    required, optional = FIELDS[kind]
    missing = sorted(required - set(raw))
    if missing:
        raise _fail(source, name, f"a {kind} probe needs {', '.join(missing)}", "add it (docs/quality.md)")
    unknown = sorted(set(raw) - required - optional - COMMON)
    if unknown:
        raise _fail(source, name, f"{', '.join(unknown)} is not a field of a {kind} probe",
                    f"remove it; a {kind} probe takes {', '.join(sorted(required | optional | COMMON))}")
    serves = raw.get("serves", kind if kind in ("embedding", "rerank") else "chat")
    if serves != (kind if kind in ("embedding", "rerank") else "chat"):
        raise _fail(source, name, f"serves = {serves!r} does not fit a {kind} probe",
                    f"remove serves (a {kind} probe serves {kind if kind in SERVES else 'chat'})")
    max_tokens = raw.get("max_tokens", DEFAULT_MAX_TOKENS[kind])
    if serves == "chat" and not _count(max_tokens, 1, 4096):
        raise _fail(source, name, f"max_tokens {max_tokens!r} is not a whole number from 1 to 4096", "set one")
    values: dict[str, Any] = {"id": pid, "kind": kind, "serves": serves,
                              "max_tokens": max_tokens if serves == "chat" else 0}
    for key in ("prompt", "system", "result", "expect", "anchor", "similar", "query", "tool", "needle"):
        if key in raw:
            if not _text(raw[key]):
                raise _fail(source, name, f"{key} is not a text", f"set {key} = \"...\"")
            values[key] = raw[key]
    for key in ("turns", "unrelated", "documents"):
        if key in raw:
            items = raw[key]
            low = {"turns": 2, "unrelated": 1, "documents": 2}[key]
            if not (isinstance(items, list) and len(items) >= low and all(_text(t) for t in items)):
                raise _fail(source, name, f"{key} is not a list of at least {low} texts", f"set {key} = [\"...\", ...]")
            values[key] = tuple(items)
    if "tools" in raw:
        tools = [_tool(t) for t in raw["tools"]] if isinstance(raw["tools"], list) else [None]
        if not tools or None in tools:
            raise _fail(source, name, "tools is not a list of {name, description, parameters} tables",
                        "write tools = [{name = \"...\", description = \"...\", parameters = {...}}]")
        for tool in tools:
            assert tool is not None
            if why := schemas.unsupported(tool["function"]["parameters"]):
                raise _fail(source, name, f"tool {tool['function']['name']}'s parameters: {why}",
                            "use only the schema keywords docs/quality.md lists")
        values["tools"] = tuple(tools)
    names = [t["function"]["name"] for t in values.get("tools", ())]
    if kind == "tool_parallel":
        values["calls"] = raw.get("calls", 3)
        if not _count(values["calls"], 2, 16):
            raise _fail(source, name, f"calls {values['calls']!r} is not a whole number from 2 to 16", "set one")
    if kind == "tool_round_trip":
        values["tool"] = raw.get("tool", names[0])
        if values["tool"] not in names:
            raise _fail(source, name, f"tool {values['tool']!r} is not among its tools", f"use one of {names}")
        if not isinstance(raw.get("arguments", {}), dict):
            raise _fail(source, name, "arguments is not a table", "set arguments = {...}")
        values["arguments"] = raw.get("arguments", {})
        values["expect"] = values.get("expect", values["result"])
    if "schema" in raw:
        if why := schemas.unsupported(raw["schema"]):
            raise _fail(source, name, f"schema: {why}", "use only the schema keywords docs/quality.md lists")
        values["schema"] = raw["schema"]
    for key in ("lines", "max_words", "max_chars"):
        if key in raw:
            if not _count(raw[key], 1, 10000):
                raise _fail(source, name, f"{key} {raw[key]!r} is not a whole number from 1 to 10000", "set one")
            values[key] = raw[key]
    if "regex" in raw:
        try:
            re.compile(raw["regex"])
        except (re.error, TypeError) as e:
            raise _fail(source, name, f"regex {raw['regex']!r} does not compile ({e})", "fix the expression") from None
        values["regex"] = raw["regex"]
    if "no_fences" in raw:
        if not isinstance(raw["no_fences"], bool):
            raise _fail(source, name, "no_fences is not true or false", "set no_fences = true or false")
        values["no_fences"] = raw["no_fences"]
    if kind == "format" and not any(k in raw for k in ("lines", "max_words", "max_chars", "regex")):
        raise _fail(source, name, "a format probe checks nothing", "give it lines, max_words, max_chars or regex")
    if kind == "needle":
        if not _count(raw["context_tokens"], 64, 10_000_000):
            raise _fail(source, name, f"context_tokens {raw['context_tokens']!r} is not a whole number of at least 64",
                        "set one")
        values["context_tokens"] = raw["context_tokens"]
        depth = raw.get("depth", 0.5)
        if not isinstance(depth, int | float) or isinstance(depth, bool) or not 0 <= depth <= 1:
            raise _fail(source, name, f"depth {depth!r} is not from 0 to 1", "set depth = 0.5 (the middle)")
        values["depth"] = float(depth)
        if "needle" in values and not re.fullmatch(r"\S{4,64}", values["needle"]):
            raise _fail(source, name, "needle is not one word of 4 to 64 characters", "set one, or leave it out")
    if kind == "rerank":
        values["relevant"] = raw.get("relevant", 0)
        if not _count(values["relevant"], 0, len(values["documents"]) - 1):
            raise _fail(source, name, f"relevant {values['relevant']!r} is not the index of one of its documents",
                        f"set it from 0 to {len(values['documents']) - 1}")
    return Probe(**values)


def parse_suite(text: str, source: str) -> Suite:
    """A suite from TOML text; `source` names it in a refusal."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise _fail(source, "the file", f"does not parse as TOML ({e})", "fix the TOML") from None
    unknown = sorted(set(data) - {"repeats", "probe"})
    if unknown:
        raise _fail(source, "the file", f"{', '.join(unknown)} is not a suite field",
                    "a suite has repeats = N and [[probe]] tables")
    repeats = data.get("repeats", DEFAULT_REPEATS)
    if not _count(repeats, 1, MAX_REPEATS):
        raise _fail(source, "repeats", f"{repeats!r} is not a whole number from 1 to {MAX_REPEATS}",
                    f"set repeats = {DEFAULT_REPEATS}")
    raw = data.get("probe", [])
    if not isinstance(raw, list) or not raw:
        raise _fail(source, "the file", "holds no probe", "add [[probe]] tables (docs/quality.md)")
    probes = [_probe(p, source, i) for i, p in enumerate(raw)]
    seen: set[str] = set()
    for p in probes:
        if p.id in seen:
            raise _fail(source, f"probe {p.id}", "the id is used twice", "give each probe its own id")
        seen.add(p.id)
    return Suite(tuple(probes), repeats, source)


def load_suite(path: str | Path | None = None) -> Suite:
    """The suite at `path`, or the packaged default (None)."""
    file = DEFAULT_SUITE if path is None else Path(path)
    source = "the default suite" if path is None else str(file)
    try:
        text = file.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise _fail(source, "the file", f"cannot be read ({getattr(e, 'strerror', None) or e})",
                    "give the path of a readable TOML file") from None
    return parse_suite(text, source)


def check_suite(suite: Suite, context_tokens: int) -> None:
    """Refuse a chat probe that needs more than a model's context (`context_tokens`, its max_model_len)."""
    for p in suite.serving("chat"):
        if p.tokens() > context_tokens:
            raise _fail(suite.source, f"probe {p.id}",
                        f"needs about {p.tokens()} tokens, more than the model's context of {context_tokens}",
                        "shorten it (a needle's context_tokens), or leave it out of the suite for this model")
