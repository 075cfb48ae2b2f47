"""sparkfleet/quality/suite.py and schema.py: the suite is data, and every bad suite is one line naming the file,
the probe and the fix."""

from __future__ import annotations

import pytest

from sparkfleet.quality import schema
from sparkfleet.quality.suite import KINDS, SuiteError, check_suite, load_suite, parse_suite
from sparkfleet.refused import Refusal

EXACT = '[[probe]]\nid = "a"\nkind = "exact"\nprompt = "What is 2 + 2?"\n'


def test_the_default_suite_loads_with_every_kind_and_fits_a_small_context():
    suite = load_suite()
    assert {p.kind for p in suite.probes} == KINDS
    assert suite.repeats == 3
    check_suite(suite, 2048)  # the sim's llama.cpp model serves 2,048 tokens
    assert {p.serves for p in suite.probes} == {"chat", "embedding", "rerank"}


def test_a_tool_becomes_openais_definition():
    probe = next(p for p in load_suite().probes if p.id == "tool-call")
    assert probe.tools[0]["type"] == "function" and probe.tools[0]["function"]["name"] == "get_weather"


@pytest.mark.parametrize("text,words", [
    ("repeats = 3\n[[probe\n", ("does not parse", "fix the TOML")),
    ('[[probe]]\nid = "x"\nkind = "vibes"\nprompt = "hi"\n', ("probe x", "unknown kind 'vibes'", "use one of")),
    ('[[probe]]\nid = "x"\nkind = "exact"\n', ("probe x", "needs prompt", "add it")),
    ("repeats = 0\n" + EXACT, ("repeats", "from 1 to 10", "set repeats = 3")),
    ("repeats = true\n" + EXACT, ("repeats", "from 1 to 10")),
    (EXACT + 'colour = "red"\n', ("probe a", "colour is not a field", "remove it")),
    (EXACT + EXACT, ("probe a", "used twice")),
    ('[[probe]]\nid = "Bad Id"\nkind = "exact"\nprompt = "x"\n', ("probe 1", "not a name")),
    (EXACT + "max_tokens = 0\n", ("probe a", "max_tokens")),
    ('[[probe]]\nid = "f"\nkind = "format"\nprompt = "x"\n', ("probe f", "checks nothing")),
    ('[[probe]]\nid = "f"\nkind = "format"\nprompt = "x"\nregex = "("\n', ("probe f", "does not compile")),
    ('[[probe]]\nid = "n"\nkind = "needle"\ncontext_tokens = 10\n', ("probe n", "context_tokens")),
    ('[[probe]]\nid = "n"\nkind = "needle"\ncontext_tokens = 500\ndepth = 2\n', ("probe n", "depth")),
    ('[[probe]]\nid = "t"\nkind = "tool_call"\nprompt = "x"\ntools = [{name = "f", parameters = {anyOf = []}}]\n',
     ("probe t", "'anyOf'", "schema keywords")),
    ('[[probe]]\nid = "r"\nkind = "rerank"\nquery = "q"\ndocuments = ["a", "b"]\nrelevant = 5\n',
     ("probe r", "relevant 5", "from 0 to 1")),
    ('[[probe]]\nid = "e"\nkind = "exact"\nserves = "embedding"\nprompt = "x"\n', ("probe e", "serves")),
    ("repeats = 3\n", ("holds no probe",)),
])
def test_a_bad_suite_is_one_line_naming_the_file_the_probe_and_the_fix(text, words):
    with pytest.raises(SuiteError) as e:
        parse_suite(text, "office.toml")
    line = str(e.value)
    assert "\n" not in line and line.startswith("office.toml: ")
    assert all(w in line for w in words), line
    assert isinstance(e.value, Refusal) and e.value.code == 2


def test_a_missing_file_is_refused_by_name(tmp_path):
    with pytest.raises(SuiteError, match="missing.toml: the file: cannot be read"):
        load_suite(tmp_path / "missing.toml")


def test_a_probe_longer_than_the_context_is_refused():
    suite = parse_suite('[[probe]]\nid = "long"\nkind = "needle"\ncontext_tokens = 9000\n', "office.toml")
    check_suite(suite, 32768)
    with pytest.raises(SuiteError, match=r"office.toml: probe long: needs about \d+ tokens, more than the model's "
                                         r"context of 8192: shorten it"):
        check_suite(suite, 8192)


def test_an_office_file_extends_with_its_own_probe(tmp_path):
    path = tmp_path / "office.toml"
    path.write_text("repeats = 5\n" + EXACT)
    suite = load_suite(path)
    assert suite.repeats == 5 and [p.id for p in suite.probes] == ["a"] and suite.source == str(path)


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}, "tags": {
    "type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "minItems": 1}},
    "required": ["n"], "additionalProperties": False}


@pytest.mark.parametrize("value,why", [
    ({"n": 1, "tags": ["a"]}, None),
    ({"n": 2.0}, None),  # JSON's 2.0 is an integer
    ({"tags": ["a"]}, "lacks 'n'"),
    ({"n": True}, "not integer"),
    ({"n": 0}, "below 1"),
    ({"n": 1, "tags": []}, "number of items"),
    ({"n": 1, "tags": ["c"]}, "not one of"),
    ({"n": 1, "x": 1}, "does not allow"),
    ([1], "not object"),
])
def test_the_schema_check(value, why):
    found = schema.problem(value, SCHEMA)
    assert (found is None) if why is None else (why in found), found


def test_a_schema_outside_the_subset_is_named():
    assert schema.unsupported(SCHEMA) is None
    assert "'$ref'" in schema.unsupported({"properties": {"a": {"$ref": "#/x"}}})
    assert "type 'text'" in schema.unsupported({"type": "text"})


@pytest.mark.parametrize("fault", ["wrong", "tool_text", "cut", "tool_args"])
def test_the_stand_ins_answer_fault_passes_the_simulators_engine_env(fault):
    """SIM_ANSWER_FAULT is one of the stand-in's SIM_* knobs (release/engines/environment.py): it reaches engine.env
    in the simulator's inventories, as issue 52's e2e canaries set it."""
    from sparkfleet.release.plan import plan_hosts

    from .helpers import host_data

    [plan] = plan_hosts([("spark-x", host_data(sim_engine_knobs=True, engine_env={"SIM_ANSWER_FAULT": fault}))],
                        resolve=False)
    assert f"SIM_ANSWER_FAULT={fault}" in plan.render_engine_env().splitlines()
