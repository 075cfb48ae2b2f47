"""The default quality suite end to end against the stand-in vLLM (sim/engine/standin_vllm.py) on loopback: a
healthy engine passes every probe, the same twice; each SIM_ANSWER_FAULT fails the probes it breaks; the gate's
cost at the stand-in's default 50 tokens/s is printed and bounded (issue 52: at most 60 s a canary)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests

from sparkfleet.quality.compare import regressions
from sparkfleet.quality.run import Evaluation, evaluate
from sparkfleet.quality.suite import load_suite
from tests.unit.helpers import KEY, Server, make_model

NAME = "sim-qwen"
CONTEXT = 8192
TOOL_PROBES = {"tool-call", "tool-parallel"}
EXACT_PROBES = {"arithmetic", "extraction"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("quality") / "model")


@pytest.fixture(scope="module")
def engine(model_dir, tmp_path_factory):
    """A chat stand-in as the fleet runs it (Qwen3.5's parser, a reasoning parser), its knob file writable."""
    knobs = tmp_path_factory.mktemp("knobs") / "engine.json"
    knobs.write_text("{}")
    s = Server(model_dir, "--served-model-name", NAME, "--api-key", KEY, "--max-model-len", str(CONTEXT),
               "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder", "--reasoning-parser", "qwen3",
               SIM_KNOB_FILE=str(knobs))
    yield s, knobs
    s.stop()


def asker(server: Server):
    def ask(path: str, body: dict):
        try:
            r = requests.post(server.base + path, json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
        except requests.RequestException as e:
            return None, None, type(e).__name__
        try:
            return r.status_code, r.json(), None
        except ValueError:
            return r.status_code, None, "not JSON"
    return ask


def run(engine, fault: str | None, baseline: Evaluation | None = None) -> Evaluation:
    server, knobs = engine
    knobs.write_text(json.dumps({"answer_fault": fault}))
    return evaluate(load_suite(), NAME, "chat", asker(server), CONTEXT, baseline)


def verdicts(e: Evaluation) -> dict[str, str]:
    return {r.id: r.verdict for r in e.results}


@pytest.fixture(scope="module")
def baseline(engine) -> Evaluation:
    return run(engine, None)


def test_healthy_passes_every_probe_twice_the_same(engine, baseline):
    t0 = time.monotonic()
    again = run(engine, None, baseline)
    seconds = time.monotonic() - t0
    print(f"\nthe default suite against the stand-in (50 tokens/s): {baseline.seconds:.1f} s (baseline), "
          f"{seconds:.1f} s (gated run)")
    assert set(verdicts(baseline).values()) == {"pass"}, [(r.id, r.why) for r in baseline.results]
    assert verdicts(again) == verdicts(baseline) and again.score == baseline.score == 1.0
    assert [r.answers for r in again.results if r.kind == "exact"] == [
        r.answers for r in baseline.results if r.kind == "exact"]
    assert regressions(baseline, again, 0.0) == []
    assert seconds < 60 and baseline.seconds < 60


def test_wrong_answers_fail_the_exact_probes(engine, baseline):
    now = run(engine, "wrong", baseline)
    failed = set(now.failed())
    assert EXACT_PROBES <= failed
    assert not TOOL_PROBES & failed  # the calls are still parsed and valid
    found = {r.probe for r in regressions(baseline, now, 0.1)}
    assert EXACT_PROBES <= found
    line = next(r.line() for r in regressions(baseline, now, 0.1) if r.probe == "arithmetic")
    assert '"5461"' in line and '"6572"' in line


def test_tool_text_fails_the_tool_probes(engine, baseline):
    now = run(engine, "tool_text", baseline)
    assert TOOL_PROBES <= set(now.failed())
    assert "no parsed tool call" in now.result("tool-call").why
    assert "<tool_call>" in now.result("tool-call").answer  # Qwen3.5's markup, as a mismatched parser leaves it
    assert not EXACT_PROBES & set(now.failed())


def test_cut_answers_fail_some_probes(engine, baseline):
    now = run(engine, "cut", baseline)
    assert {"json-schema", "format-lines", "tool-call"} <= set(now.failed())
    assert "cut at max_tokens" in now.result("json-schema").why
    assert now.score is not None and now.score < baseline.score


def test_tool_args_fail_the_schema_check_with_calls_parsed(engine, baseline):
    """Calls still parsed (the health gate's check passes), their arguments wrong: only the schema check sees it."""
    now = run(engine, "tool_args", baseline)
    assert TOOL_PROBES <= set(now.failed())
    assert "get_weather's arguments" in now.result("tool-call").why


def test_a_parser_that_does_not_read_the_model_gives_text(model_dir):
    """hermes on a Qwen3.5 checkpoint (XML calls): the calls reach the client as text, as vLLM does."""
    s = Server(model_dir, "--served-model-name", NAME, "--api-key", KEY, "--enable-auto-tool-choice",
               "--tool-call-parser", "hermes")
    try:
        now = evaluate(load_suite(), NAME, "chat", asker(s), CONTEXT)
    finally:
        s.stop()
    assert TOOL_PROBES <= set(now.failed())
    assert "<function=get_weather>" in now.result("tool-call").answer


def test_an_engine_that_cannot_be_asked_is_not_evaluated(model_dir):
    s = Server(model_dir, "--served-model-name", NAME, "--api-key", KEY)
    s.stop()
    now = evaluate(load_suite(), NAME, "chat", asker(s), CONTEXT)
    assert not now.evaluated and now.score is None
    assert {r.verdict for r in now.results} == {"not_evaluated"}


@pytest.mark.parametrize("kind,flags", [("embedding", ("--runner", "pooling", "--convert", "embed")),
                                        ("rerank", ("--runner", "pooling", "--convert", "classify"))])
def test_rag_services_pass_their_probes(model_dir, kind, flags):
    s = Server(model_dir, "--served-model-name", NAME, *flags)
    try:
        now = evaluate(load_suite(), NAME, kind, asker(s), CONTEXT)
    finally:
        s.stop()
    assert now.evaluated and now.score == 1.0, [(r.id, r.answer, r.why) for r in now.results]
    assert {r.kind for r in now.results} == {kind}
