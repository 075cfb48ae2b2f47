"""One model through the suite, over the caller's `ask` (the guard's URL, key and TLS are the caller's: no I/O here).

The rules (docs/quality.md):
- every chat request is at temperature 0 with thinking off (chat_template_kwargs enable_thinking false);
- a probe is asked up to `repeats` times and stops once its verdict cannot change;
- an exact probe passes when one of its answers is one the baseline saw (its reference is the model's own earlier
  answer); with no baseline (or none evaluated) its answers are recorded and it passes;
- every other probe is absolute: it passes when most of its answered repeats pass (more than half);
- a request that could not be asked (no answer, a timeout, HTTP 401, 403, 404, 408, 429 or 5xx) leaves its repeat
  unanswered; a probe with no answered repeat is not_evaluated, never a fail. Any other HTTP status (400, 422:
  the engine refused the probe's request, as one without tool parsing refuses tools) is an answer that fails;
- score = passed / evaluated probes; a model with no evaluated probe has evaluated False and score None.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from sparkfleet.quality import schema as schemas
from sparkfleet.quality.suite import FILLER_WORDS_PER_TOKEN, Probe, Suite
from sparkfleet.tables import clean

# ask(path, JSON body) -> (HTTP status or None, parsed JSON or None, why-not in words or None)
Ask = Callable[[str, dict], tuple[int | None, dict | None, str | None]]
VERDICTS = ("pass", "fail", "not_evaluated")
ANSWER_MAX = 200
UNASKED = frozenset({401, 403, 404, 408, 429})
CHAT = "/v1/chat/completions"
THINK = re.compile(r"^\s*<think>.*?</think>\s*", re.DOTALL)
FILLER = ("The archive keeps its ledgers in order by year and by hand. Each clerk copies the totals twice and signs "
          "the page before the lamps are lit. Visitors walk the long hall in silence and the clocks agree on the "
          "hour. Nothing in these rooms is urgent and nothing is lost.").split()


@dataclass
class ProbeResult:
    id: str
    kind: str
    verdict: str  # "pass" | "fail" | "not_evaluated"
    answer: str  # terminal-safe, at most ANSWER_MAX characters: the answer that decided (a failing one if any)
    why: str
    answers: list[str] = field(default_factory=list)  # every distinct answer seen (cleaned): an exact probe's reference

    def to_dict(self) -> dict:
        return {"id": self.id, "kind": self.kind, "verdict": self.verdict, "answer": self.answer, "why": self.why,
                "answers": list(self.answers)}


@dataclass
class Evaluation:
    model: str
    serves: str
    results: list[ProbeResult]
    score: float | None
    evaluated: bool
    seconds: float

    def result(self, probe_id: str) -> ProbeResult | None:
        return next((r for r in self.results if r.id == probe_id), None)

    def failed(self) -> list[str]:
        return [r.id for r in self.results if r.verdict == "fail"]

    def to_dict(self) -> dict:
        return {"model": self.model, "serves": self.serves, "results": [r.to_dict() for r in self.results],
                "score": self.score, "evaluated": self.evaluated, "seconds": self.seconds}

    @classmethod
    def from_dict(cls, d: Any) -> Evaluation:
        """An evaluation from its dict (a baseline file: untrusted): a wrong shape is a ValueError."""
        if not isinstance(d, dict):
            raise ValueError("an evaluation is not a JSON object")
        model, serves, results = d.get("model"), d.get("serves"), d.get("results")
        score, evaluated, seconds = d.get("score"), d.get("evaluated"), d.get("seconds")
        if not isinstance(model, str) or not isinstance(serves, str):
            raise ValueError("an evaluation's model or serves is not a text")
        if not isinstance(results, list) or not isinstance(evaluated, bool):
            raise ValueError("an evaluation's results is not a list or its evaluated not true/false")
        if not _number(seconds) or seconds < 0:
            raise ValueError("an evaluation's seconds is not a number")
        took = float(seconds)
        if score is not None and (not _number(score) or not 0 <= score <= 1):
            raise ValueError("an evaluation's score is not a number from 0 to 1")
        parsed = []
        for r in results:
            if not isinstance(r, dict):
                raise ValueError("a probe result is not a JSON object")
            texts = [r.get(k) for k in ("id", "kind", "verdict", "answer", "why")]
            if not all(isinstance(t, str) for t in texts) or r["verdict"] not in VERDICTS:
                raise ValueError("a probe result lacks id, kind, verdict, answer or why")
            answers = r.get("answers", [])
            if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
                raise ValueError("a probe result's answers is not a list of texts")
            parsed.append(ProbeResult(clean(r["id"], 64), clean(r["kind"], 32), r["verdict"],
                                      clean(r["answer"], ANSWER_MAX), clean(r["why"], ANSWER_MAX),
                                      [clean(a, ANSWER_MAX) for a in answers[:16]]))
        if evaluated != any(r.verdict != "not_evaluated" for r in parsed) or (score is None) == evaluated:
            raise ValueError("an evaluation's evaluated and score disagree with its results")
        return cls(model, serves, parsed, None if score is None else float(score), evaluated, took)


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def safe(text: Any) -> str:
    """An answer as it is kept and shown: terminal-safe, whitespace collapsed, at most ANSWER_MAX characters."""
    return clean(" ".join(str(text).split()), ANSWER_MAX)


@dataclass
class Reply:
    """One answered request: its verdict (True pass, False fail) and what it said."""

    ok: bool
    answer: str
    why: str = ""


class Unanswered(Exception):
    """A request that could not be asked: its repeat does not count."""


def _ask(ask: Ask, path: str, body: dict) -> tuple[dict | None, str | None]:
    """(the reply, None) or (None, why the engine refused it); Unanswered when it could not be asked."""
    try:
        status, reply, why = ask(path, body)
    except Exception as e:  # noqa: BLE001 - a caller's transport error is an unanswered request, not a verdict
        raise Unanswered(f"the request failed ({type(e).__name__})") from None
    if status is None:
        raise Unanswered(why or "no answer")
    if status in UNASKED or status >= 500:
        raise Unanswered(f"HTTP {status}{': ' + why if why else ''}")
    if status != 200:
        return None, f"HTTP {status}: {_error(reply, why)}"
    if not isinstance(reply, dict):
        return None, "the answer is not a JSON object"
    return reply, None


def _error(reply: Any, why: str | None) -> str:
    error = reply.get("error") if isinstance(reply, dict) else None
    message = error.get("message") if isinstance(error, dict) else error if isinstance(error, str) else None
    return str(message or why or "refused")


def _message(reply: dict) -> tuple[dict, str]:
    """The first choice's message and finish reason (an empty message when there is none)."""
    choices = reply.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message")
    return (message if isinstance(message, dict) else {}), str(choice.get("finish_reason") or "")


def _content(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return THINK.sub("", content) if isinstance(content, str) else ""


def _chat_body(model: str, probe: Probe, messages: list[dict], **extra: Any) -> dict:
    return {"model": model, "messages": messages, "max_tokens": probe.max_tokens, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False}, **extra}


def _messages(probe: Probe, prompt: str) -> list[dict]:
    return ([{"role": "system", "content": probe.system}] if probe.system else []) + [
        {"role": "user", "content": prompt}]


def _chat(ask: Ask, model: str, probe: Probe, messages: list[dict], **extra: Any) -> tuple[dict, str, str | None]:
    """(message, finish reason, None), or ({}, "", why the engine refused the request)."""
    reply, refused = _ask(ask, CHAT, _chat_body(model, probe, messages, **extra))
    if reply is None:
        return {}, "", refused
    message, finish = _message(reply)
    return message, finish, None


def _cut(finish: str) -> str:
    return "the answer was cut at max_tokens" if finish == "length" else ""


def _calls(message: dict, tools: dict[str, dict]) -> tuple[list[str], str | None]:
    """The parsed tool calls as `name(arguments)`, or why one is not a valid call of a given tool."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        return [], "no parsed tool call (content: " + safe(_content(message) or "none") + ")"
    shown: list[str] = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or function.get("name") not in tools:
            return shown, f"a call of an unknown tool: {safe(call)}"
        name, raw = function["name"], function.get("arguments")
        shown.append(f"{name}({raw})")
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            return shown, f"{name}'s arguments are not JSON: {safe(raw)}"
        if why := schemas.problem(args, tools[name]["function"]["parameters"], "arguments"):
            return shown, f"{name}'s {why}"
    return shown, None


def _tool_probe(ask: Ask, model: str, probe: Probe) -> Reply:
    tools = {t["function"]["name"]: dict(t) for t in probe.tools}
    message, finish, refused = _chat(ask, model, probe, _messages(probe, probe.prompt), tools=list(probe.tools),
                                     tool_choice="auto")
    if refused:
        return Reply(False, "", refused)
    shown, why = _calls(message, tools)
    answer = "; ".join(shown) or _content(message)
    if why:
        return Reply(False, answer, why)
    wanted = probe.calls if probe.kind == "tool_parallel" else 1
    if len(shown) < wanted:
        return Reply(False, answer, f"{len(shown)} tool call(s), {wanted} asked for")
    return Reply(True, answer)


def _round_trip(ask: Ask, model: str, probe: Probe) -> Reply:
    call_id = "call_" + probe.id.replace("-", "_").replace(".", "_")[:24]
    messages = _messages(probe, probe.prompt) + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": probe.tool, "arguments": json.dumps(dict(probe.arguments))}}]},
        {"role": "tool", "tool_call_id": call_id, "content": probe.result}]
    message, finish, refused = _chat(ask, model, probe, messages, tools=list(probe.tools), tool_choice="auto")
    if refused:
        return Reply(False, "", refused)
    answer = _content(message)
    if probe.expect not in answer:
        return Reply(False, answer, f"the answer does not use the tool's result {probe.expect!r}")
    return Reply(True, answer)


def _json_schema(ask: Ask, model: str, probe: Probe) -> Reply:
    response_format = {"type": "json_schema", "json_schema": {"name": probe.id.replace("-", "_").replace(".", "_"),
                                                              "schema": dict(probe.schema or {})}}
    message, finish, refused = _chat(ask, model, probe, _messages(probe, probe.prompt),
                                     response_format=response_format)
    if refused:
        return Reply(False, "", refused)
    answer = _content(message)
    try:
        value = json.loads(answer)
    except ValueError:
        return Reply(False, answer, _cut(finish) or "the answer is not JSON")
    if why := schemas.problem(value, dict(probe.schema or {})):
        return Reply(False, answer, f"the answer breaks the schema: {why}")
    return Reply(True, answer)


def format_problem(probe: Probe, answer: str) -> str | None:
    """Why `answer` breaks a format probe's checks (None when it keeps them all)."""
    text = answer.strip()
    lines = [line for line in text.splitlines() if line.strip()]
    if probe.lines is not None and len(lines) != probe.lines:
        return f"{len(lines)} non-empty line(s), {probe.lines} asked for"
    if probe.max_words is not None and len(text.split()) > probe.max_words:
        return f"{len(text.split())} words, at most {probe.max_words} asked for"
    if probe.max_chars is not None and len(text) > probe.max_chars:
        return f"{len(text)} characters, at most {probe.max_chars} asked for"
    if probe.regex is not None and not re.search(probe.regex, text):
        return f"does not match {probe.regex!r}"
    if probe.no_fences and "```" in text:
        return "holds a code fence"
    return None


def _format(ask: Ask, model: str, probe: Probe) -> Reply:
    message, finish, refused = _chat(ask, model, probe, _messages(probe, probe.prompt))
    if refused:
        return Reply(False, "", refused)
    answer = _content(message)
    why = _cut(finish) or format_problem(probe, answer)
    return Reply(why is None or why == "", answer, why or "")


def needle_prompt(probe: Probe) -> str:
    """The needle's filler of about context_tokens tokens, the needle's sentence at its depth, then the question."""
    words = max(int(probe.context_tokens * FILLER_WORDS_PER_TOKEN) - 40, len(FILLER))
    filler = [FILLER[i % len(FILLER)] for i in range(words)]
    at = int(len(filler) * probe.depth)
    while at < len(filler) and at > 0 and not filler[at - 1].endswith("."):  # a sentence's start
        at += 1
    sentence = f"The secret code word is {probe.needle_token()}."
    text = " ".join(filler[:at] + [sentence] + filler[at:])
    return (f"Read the text below.\n\n{text}\n\nWhat is the secret code word? Reply with the code word only, "
            "exactly as written.")


def _needle(ask: Ask, model: str, probe: Probe) -> Reply:
    message, finish, refused = _chat(ask, model, probe, [{"role": "user", "content": needle_prompt(probe)}])
    if refused:
        return Reply(False, "", refused)
    answer = _content(message)
    if probe.needle_token() not in answer:
        return Reply(False, answer, _cut(finish) or f"the answer does not quote the code word {probe.needle_token()}")
    return Reply(True, answer)


def _multi_turn(ask: Ask, model: str, probe: Probe) -> Reply:
    messages: list[dict] = [{"role": "system", "content": probe.system}]
    answers: list[str] = []
    for turn, prompt in enumerate(probe.turns, 1):
        messages.append({"role": "user", "content": prompt})
        message, finish, refused = _chat(ask, model, probe, list(messages))  # the caller may keep the body
        if refused:
            return Reply(False, " | ".join(answers), f"turn {turn}: {refused}")
        answer = _content(message)
        answers.append(answer)
        if why := _cut(finish) or (None if re.search(probe.regex or "", answer.strip()) else
                                   f"does not match {probe.regex!r}"):
            return Reply(False, " | ".join(answers), f"turn {turn} broke the system's rule: {why}")
        messages.append({"role": "assistant", "content": answer})
    return Reply(True, " | ".join(answers))


def _cosine(a: list, b: list) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def _embedding(ask: Ask, model: str, probe: Probe) -> Reply:
    texts = [probe.anchor, probe.similar, *probe.unrelated]
    reply, refused = _ask(ask, "/v1/embeddings", {"model": model, "input": texts})
    if reply is None:
        return Reply(False, "", refused or "")
    data = reply.get("data")
    try:
        ordered = sorted(data, key=lambda d: d["index"]) if isinstance(data, list) else []
        vectors = [[float(x) for x in d["embedding"]] for d in ordered]
    except (TypeError, KeyError, ValueError):
        return Reply(False, safe(data), "the answer holds no list of float vectors")
    if len(vectors) != len(texts) or len({len(v) for v in vectors}) != 1 or not vectors[0]:
        return Reply(False, f"{len(vectors)} vectors", f"{len(texts)} vectors of one size expected")
    near = _cosine(vectors[0], vectors[1])
    far = max(_cosine(vectors[0], v) for v in vectors[2:])
    answer = f"similar {near:.3f}, unrelated {far:.3f}"
    return Reply(near > far, answer, "" if near > far else "the similar text is not the closest")


def _rerank(ask: Ask, model: str, probe: Probe) -> Reply:
    reply, refused = _ask(ask, "/v1/rerank", {"model": model, "query": probe.query,
                                             "documents": list(probe.documents)})
    if reply is None:
        return Reply(False, "", refused or "")
    results = reply.get("results")
    try:
        ranked = sorted(results, key=lambda r: -float(r["relevance_score"])) if isinstance(results, list) else []
        top = int(ranked[0]["index"])
    except (TypeError, KeyError, ValueError, IndexError):
        return Reply(False, safe(results), "the answer holds no ranked results")
    answer = f"document {top} first"
    return Reply(top == probe.relevant, answer,
                 "" if top == probe.relevant else f"document {probe.relevant} is the relevant one")


def _exact(ask: Ask, model: str, probe: Probe) -> Reply:
    message, finish, refused = _chat(ask, model, probe, _messages(probe, probe.prompt))
    if refused:
        return Reply(False, "", refused)
    return Reply(True, _content(message).strip())


CHECKS: dict[str, Callable[[Ask, str, Probe], Reply]] = {
    "exact": _exact, "tool_call": _tool_probe, "tool_parallel": _tool_probe, "tool_round_trip": _round_trip,
    "json_schema": _json_schema, "format": _format, "needle": _needle, "multi_turn": _multi_turn,
    "embedding": _embedding, "rerank": _rerank}


def _verdict(probe: Probe, repeats: int, ask: Ask, model: str, reference: set[str] | None) -> ProbeResult:
    replies: list[Reply] = []
    unanswered = ""
    for _ in range(repeats):
        try:
            reply = CHECKS[probe.kind](ask, model, probe)
        except Unanswered as e:
            unanswered = str(e)
            continue
        if probe.kind == "exact" and reference is not None:
            reply.ok = reply.ok and safe(reply.answer) in reference
            reply.why = "" if reply.ok else reply.why or "an answer the baseline never gave"
        replies.append(reply)
        passed = sum(r.ok for r in replies)
        if probe.kind == "exact":
            if reference is not None and passed:  # one answer the baseline gave is enough
                break
        elif passed * 2 > repeats or (len(replies) - passed) * 2 >= repeats:  # the majority is decided
            break
    answers = list(dict.fromkeys(safe(r.answer) for r in replies))
    if not replies:
        return ProbeResult(probe.id, probe.kind, "not_evaluated", "", safe(f"not asked: {unanswered}"), [])
    passed = sum(r.ok for r in replies)
    ok = passed > 0 if probe.kind == "exact" else passed * 2 > len(replies)
    shown = next((r for r in replies if r.ok == ok), replies[0])
    why = "" if ok else shown.why
    if probe.kind == "exact" and reference is None and ok:
        why = "recorded as the reference (no baseline)"
    elif probe.kind == "exact" and not ok:
        why = f"{why}: the baseline answered {', '.join(sorted(reference or ()))}"
    return ProbeResult(probe.id, probe.kind, "pass" if ok else "fail", safe(shown.answer), safe(why), answers)


def evaluate(suite: Suite, model: str, serves: str, ask: Ask, context_tokens: int,
             baseline: Evaluation | None = None) -> Evaluation:
    """Run the suite's probes for what the model serves ("chat", "embedding", "rerank"; serving's "reranker" too)."""
    t0 = time.monotonic()
    results = []
    for probe in suite.serving("rerank" if serves == "reranker" else serves):
        if probe.serves == "chat" and probe.tokens() > context_tokens:
            results.append(ProbeResult(probe.id, probe.kind, "not_evaluated", "",
                                       f"needs about {probe.tokens()} tokens, the context is {context_tokens}"))
            continue
        before = baseline.result(probe.id) if baseline is not None else None
        reference = set(before.answers or [before.answer]) if before and before.verdict != "not_evaluated" else None
        results.append(_verdict(probe, suite.repeats, ask, model, reference))
    judged = [r for r in results if r.verdict != "not_evaluated"]
    score = sum(r.verdict == "pass" for r in judged) / len(judged) if judged else None
    return Evaluation(model, serves, results, score, bool(judged), round(time.monotonic() - t0, 3))
