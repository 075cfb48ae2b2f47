"""sparkfleet/quality/run.py and compare.py, hermetic: `ask` is faked in-process. The rules: repeats stop once the
verdict is decided, an exact probe passes on any answer its baseline saw, an absolute one on a majority, a request
that could not be asked is never a fail, and a regression names the probe and both answers, cleaned."""

from __future__ import annotations

import json
import re

import pytest

from sparkfleet.quality.compare import SCORE, Regression, regressions
from sparkfleet.quality.run import Evaluation, ProbeResult, evaluate, needle_prompt
from sparkfleet.quality.suite import load_suite, parse_suite

EXACT = '[[probe]]\nid = "sum"\nkind = "exact"\nprompt = "What is 2 + 2?"\n'
TOOL = ('[[probe]]\nid = "tool"\nkind = "tool_call"\nprompt = "Use f."\n'
        'tools = [{name = "f", parameters = {type = "object", properties = {x = {type = "integer"}}, '
        'required = ["x"]}}]\n')


def chat(content=None, finish="stop", calls=None):
    message = {"role": "assistant", "content": content}
    if calls is not None:
        message["tool_calls"] = [{"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
                                 for i, (n, a) in enumerate(calls)]
    return 200, {"choices": [{"message": message, "finish_reason": finish}]}, None


class Script:
    """An ask that answers from a list, one reply a request (the last repeated), recording each request."""

    def __init__(self, *replies):
        self.replies = list(replies)
        self.bodies: list[tuple[str, dict]] = []

    def __call__(self, path, body):
        self.bodies.append((path, body))
        reply = self.replies[min(len(self.bodies) - 1, len(self.replies) - 1)]
        if isinstance(reply, Exception):
            raise reply
        return reply


def run(text, ask, baseline=None, context=4096, serves="chat"):
    return evaluate(parse_suite(text, "t.toml"), "m", serves, ask, context, baseline)


def test_every_chat_request_is_greedy_with_thinking_off():
    ask = Script(chat(calls=[("f", '{"x": 1}')]))
    run(TOOL, ask)
    path, body = ask.bodies[0]
    assert path == "/v1/chat/completions"
    assert body["temperature"] == 0 and body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["tool_choice"] == "auto" and body["tools"][0]["function"]["name"] == "f"
    assert body["model"] == "m" and body["max_tokens"] == 96


def test_an_exact_probe_without_baseline_records_every_answer_and_passes():
    ask = Script(chat("4"), chat("4"), chat("four"))
    e = run(EXACT, ask)
    r = e.result("sum")
    assert (r.verdict, r.answers, len(ask.bodies)) == ("pass", ["4", "four"], 3)
    assert "reference" in r.why and e.score == 1.0 and e.evaluated


def test_an_exact_probe_passes_on_any_answer_its_baseline_saw_and_stops_there():
    baseline = run(EXACT, Script(chat("4"), chat("four")))
    ask = Script(chat("IV"), chat("four"), chat("4"))
    r = run(EXACT, ask, baseline).result("sum")
    assert r.verdict == "pass" and len(ask.bodies) == 2  # the second answer was one the baseline gave
    r = run(EXACT, Script(chat("5")), baseline).result("sum")
    assert r.verdict == "fail" and r.answer == "5" and "the baseline answered 4, four" in r.why


def test_an_absolute_probe_passes_on_a_majority_and_stops_once_decided():
    good, bad = chat(calls=[("f", '{"x": 1}')]), chat(calls=[("f", '{"x": "one"}')])
    ask = Script(good, good)
    assert run(TOOL, ask).result("tool").verdict == "pass" and len(ask.bodies) == 2
    ask = Script(good, bad, good)
    assert run(TOOL, ask).result("tool").verdict == "pass" and len(ask.bodies) == 3
    ask = Script(bad, bad)
    r = run(TOOL, ask).result("tool")
    assert (r.verdict, len(ask.bodies)) == ("fail", 2) and "arguments.x is str, not integer" in r.why


@pytest.mark.parametrize("reply", [(None, None, "timed out"), (503, {"error": "x"}, None), (429, None, None),
                                   (401, None, None), ConnectionError("refused")])
def test_a_request_that_could_not_be_asked_is_not_evaluated_never_a_fail(reply):
    e = run(EXACT + TOOL, Script(reply))
    assert {r.verdict for r in e.results} == {"not_evaluated"}
    assert e.evaluated is False and e.score is None


def test_the_answered_repeats_decide_when_some_could_not_be_asked():
    r = run(TOOL, Script((503, None, None), chat(calls=[("f", '{"x": 1}')]))).result("tool")
    assert r.verdict == "pass"


def test_a_refused_request_is_an_answer_that_fails():
    """A 400 is the engine's answer (tool parsing off, say): a release that loses a feature fails its probe."""
    ask = Script((400, {"error": {"message": '"auto" tool choice requires --enable-auto-tool-choice'}}, None))
    r = run(TOOL, ask).result("tool")
    assert r.verdict == "fail" and r.why.startswith("HTTP 400: \"auto\" tool choice")


def test_tool_calls_as_text_fail_as_a_mismatched_parser_does():
    r = run(TOOL, Script(chat('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'))).result("tool")
    assert r.verdict == "fail" and r.why.startswith("no parsed tool call")


def test_score_is_passed_over_evaluated():
    text = EXACT + TOOL + '[[probe]]\nid = "w"\nkind = "format"\nprompt = "Say READY"\nregex = "^READY$"\n'

    def ask(path, body):
        if body.get("tools"):
            return 503, None, None  # the tool probe: not evaluated
        return chat("READY!") if "READY" in body["messages"][-1]["content"] else chat("4")

    e = run(text, ask)
    assert [r.verdict for r in e.results] == ["pass", "not_evaluated", "fail"]
    assert e.score == 0.5


def test_format_checks_and_a_cut_answer():
    text = ('[[probe]]\nid = "l"\nkind = "format"\nprompt = "3 lines"\nlines = 3\nmax_words = 6\n')
    assert run(text, Script(chat("a\nb\n\nc"))).result("l").verdict == "pass"
    assert "2 non-empty line(s)" in run(text, Script(chat("a\nb"))).result("l").why
    assert "cut at max_tokens" in run(text, Script(chat("a\nb\nc", finish="length"))).result("l").why
    assert "code fence" in run(text, Script(chat("```\nb\n```"))).result("l").why


def test_the_needle_sits_at_its_depth_and_must_be_quoted():
    suite = parse_suite('[[probe]]\nid = "n"\nkind = "needle"\ncontext_tokens = 2000\ndepth = 0.25\n', "t.toml")
    probe = suite.probes[0]
    prompt = needle_prompt(probe)
    at = prompt.index(probe.needle_token()) / len(prompt)
    assert 0.2 < at < 0.3 and prompt.count(probe.needle_token()) == 1
    assert len(prompt.split()) <= 2000 * 0.6 + 60  # the filler stays under context_tokens for any usual tokenizer
    assert re.fullmatch(r"[0-9A-Z]{4}-[0-9A-Z]{4}", probe.needle_token())

    def ask(path, body):
        found = re.search(r"code word is (\S+)\.", body["messages"][-1]["content"]).group(1)
        return chat(f"The code word is {found}.")

    assert evaluate(suite, "m", "chat", ask, 4096).result("n").verdict == "pass"
    assert evaluate(suite, "m", "chat", Script(chat("XXXX-YYYY")), 4096).result("n").verdict == "fail"
    assert evaluate(suite, "m", "chat", ask, 1024).result("n").verdict == "not_evaluated"  # longer than the context


def test_multi_turn_keeps_the_answers_and_checks_every_turn():
    text = ('[[probe]]\nid = "m"\nkind = "multi_turn"\nsystem = "End with OVER."\nturns = ["a", "b"]\n'
            'regex = "OVER$"\n')
    ask = Script(chat("one OVER"), chat("two OVER"))
    assert run(text, ask).result("m").verdict == "pass"
    assert [m["content"] for m in ask.bodies[1][1]["messages"]] == ["End with OVER.", "a", "one OVER", "b"]
    r = run(text, Script(chat("one OVER"), chat("two"))).result("m")
    assert r.verdict == "fail" and r.why.startswith("turn 2")


def test_round_trip_and_json_schema():
    text = ('[[probe]]\nid = "rt"\nkind = "tool_round_trip"\nprompt = "stock?"\nresult = "41"\n'
            'tools = [{name = "s"}]\n'
            '[[probe]]\nid = "js"\nkind = "json_schema"\nprompt = "json"\n'
            'schema = {type = "object", properties = {a = {type = "string"}}, required = ["a"]}\n')

    def ask(path, body):
        if "response_format" in body:
            assert body["response_format"]["type"] == "json_schema"
            return chat(json.dumps({"a": "x"}))
        assert body["messages"][-1] == {"role": "tool", "tool_call_id": "call_rt", "content": "41"}
        return chat("There are 41 in stock.")

    assert [r.verdict for r in run(text, ask).results] == ["pass", "pass"]
    assert run(text, Script(chat("{"))).result("js").why == "the answer is not JSON"


def test_embedding_and_rerank_probes():
    suite = load_suite()

    def ask(path, body):
        if path == "/v1/embeddings":
            vectors = [[1.0, 0.0], [0.9, 0.1]] + [[0.0, 1.0]] * (len(body["input"]) - 2)
            return 200, {"data": [{"index": i, "embedding": v} for i, v in enumerate(vectors)]}, None
        assert path == "/v1/rerank"
        return 200, {"results": [{"index": 1, "relevance_score": 0.2}, {"index": 0, "relevance_score": 0.9}]}, None

    assert evaluate(suite, "e", "embedding", ask, 4096).score == 1.0
    e = evaluate(suite, "r", "reranker", ask, 4096)  # serving's kind name works too
    assert e.score == 1.0 and e.serves == "reranker" and [r.kind for r in e.results] == ["rerank"]


def test_an_evaluation_round_trips_and_untrusted_input_is_checked():
    e = run(EXACT, Script(chat("4\x1b[2J")))
    assert e.results[0].answer == "4\\x1b[2J"  # terminal-safe when kept
    assert Evaluation.from_dict(json.loads(json.dumps(e.to_dict()))) == e
    good = e.to_dict()
    for bad in ([], {**good, "score": 2}, {**good, "results": [{"id": "x"}]}, {**good, "evaluated": "yes"},
                {**good, "score": None}, {**good, "seconds": float("nan")},
                {**good, "results": [{**good["results"][0], "verdict": "maybe"}]},
                {**good, "results": [{**good["results"][0], "answers": "4"}]}):
        with pytest.raises(ValueError):
            Evaluation.from_dict(bad)
    hostile = {**good, "results": [{**good["results"][0], "answer": "\x1b]0;owned\x07"}]}
    assert "\x1b" not in Evaluation.from_dict(hostile).results[0].answer


def result(pid, verdict, answer="a"):
    return ProbeResult(pid, "exact", verdict, answer, "" if verdict == "pass" else "differs", [answer])


def evaluation(*results, score=None):
    judged = [r for r in results if r.verdict != "not_evaluated"]
    if score is None and judged:
        score = sum(r.verdict == "pass" for r in judged) / len(judged)
    return Evaluation("m", "chat", list(results), score, bool(judged), 1.0)


def test_a_probe_that_passed_and_fails_now_is_a_regression_naming_both_answers():
    before = evaluation(result("a", "pass", "5461"), result("b", "fail"), result("c", "not_evaluated"))
    now = evaluation(result("a", "fail", "6572\x1b[31m"), result("b", "fail"), result("c", "fail"))
    found = regressions(before, now, 0.9)
    assert [r.probe for r in found] == ["a"]
    line = found[0].line()
    assert '"5461"' in line and '"6572\\x1b[31m"' in line and "\x1b" not in line and "\n" not in line
    assert line.startswith("probe a passed in the baseline and fails now (differs)")


def test_a_score_below_the_baseline_by_more_than_the_margin():
    before = evaluation(result("a", "pass"), result("b", "pass"), result("c", "pass"), result("d", "pass"))
    now = evaluation(result("a", "pass"), result("b", "pass"), result("c", "pass"), result("e", "fail"))
    assert [r.probe for r in regressions(before, now, 0.3)] == []  # 0.75 against 1.0: within 0.3
    found = regressions(before, now, 0.2)
    assert [r.probe for r in found] == [SCORE]
    assert found[0].line() == "score 0.75, below the baseline's 1.00: more than the margin 0.20 below"
    assert regressions(before, before, 0.0) == []


def test_a_model_not_evaluated_now_is_never_a_regression():
    before = evaluation(result("a", "pass"))
    now = evaluation(result("a", "not_evaluated"))
    assert now.evaluated is False and regressions(before, now, 0.0) == []


@pytest.mark.parametrize("margin", [-0.1, 1.0, 1.5])
def test_a_margin_out_of_range_is_a_bug_of_the_caller(margin):
    with pytest.raises(ValueError):
        regressions(evaluation(result("a", "pass")), evaluation(result("a", "pass")), margin)


def test_regression_is_frozen_data():
    r = Regression("a", "x", "y", "why")
    with pytest.raises(AttributeError):
        r.probe = "b"  # type: ignore[misc]
