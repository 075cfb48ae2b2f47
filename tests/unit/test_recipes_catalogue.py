"""The catalogue Spark owners recognise: every figure sourced, engines known, no model inheriting another's
parsers, and `sparkfleet recipes`."""

from __future__ import annotations

import json

import pytest

from sparkfleet import cli
from sparkfleet.contract.engines import ENGINES
from sparkfleet.contract.recipes import MODEL_SPECIFIC, VERSION_SETTING, catalogue, missing_notes, recipe
from sparkfleet.contract.settings import USER_SET_KEY, parse_settings
from sparkfleet.model.fit import fit_report

from .helpers import DEFAULTS, host_data

ALL = sorted(catalogue())
CHAT = sorted(n for n, r in catalogue().items() if r.kind == "chat")


@pytest.mark.parametrize("name", ALL)
def test_every_figure_of_every_recipe_names_its_source(name):
    r = recipe(name)
    assert not missing_notes(r), f"{name}: add [notes] for {missing_notes(r)}"
    assert r.sources and all(isinstance(s, str) and s for s in r.sources)
    assert r.measured.get("source"), f"{name}: [measured] says where its figures come from, or that none exist"
    for figure, note in r.notes.items():
        assert figure == "weight_bytes" or figure.startswith(("config.", "measured.")), figure
        if figure.startswith("measured.") and figure != "measured.*":
            assert figure.removeprefix("measured.") in r.measured, f"{name}: a note for no figure: {figure}"
    if "estimate" not in r.notes["weight_bytes"]:  # a figure that is not an estimate is a published listing
        assert any(word in r.notes["weight_bytes"] for word in ("bytes at", "listing", "Content-Length"))


def test_a_figure_without_a_note_is_found(tmp_path):
    (tmp_path / "bare.toml").write_text('name = "bare"\nkind = "chat"\n[model]\nrepo = "a/b"\nweight_bytes = 1\n'
                                        '[measured]\ndecode_tokens_per_s = 9.0\nsource = "x"\n'
                                        '[notes]\n"measured.decode_tokens_per_s" = "x"\n')
    assert missing_notes(catalogue(tmp_path)["bare"]) == ["weight_bytes"]


@pytest.mark.parametrize("name", CHAT)
def test_every_chat_recipe_names_a_known_engine_its_image_and_version(name):
    r = recipe(name)
    s = parse_settings("a", host_data(recipe=name))
    assert r.engine in ENGINES and s.engine == r.engine
    assert s.engine_image == r.settings.get("engine_image", DEFAULTS["engine_image"])
    assert getattr(s, VERSION_SETTING[s.engine]) == r.settings.get(VERSION_SETTING[s.engine],
                                                                    DEFAULTS[VERSION_SETTING[s.engine]])
    if s.engine == "llamacpp":  # llama.cpp has no tool, reasoning or multimodal flags of vLLM's kind
        assert all(getattr(s, k) == v for k, v in MODEL_SPECIFIC.items())
        assert s.model_files and all(glob.endswith(".gguf") for glob in s.model_files)
    if s.engine == "vllm" and s.engine_image.startswith("vllm/vllm-openai:v"):
        assert s.engine_image.endswith(f":v{s.vllm_version}")


@pytest.mark.parametrize("name", ["gpt-oss-120b", "gpt-oss-120b-llamacpp", "qwen3-coder-30b-a3b-fp8",
                                  "llama-3.3-70b-nvfp4", "nemotron-nano-9b-v2", "qwen3-8b-gguf",
                                  "qwen3.5-35b-a3b-fp8-sglang"])
def test_the_catalogue_holds_the_models_spark_owners_run(name):
    r = recipe(name)
    report = fit_report(r.model.config, r.model.weight_bytes,
                        max_model_len=min(parse_settings("a", host_data(recipe=name)).max_model_len,
                                          (r.model.config.get("text_config") or r.model.config)[
                                              "max_position_embeddings"]))
    assert report.fits and report.sparks_needed == 1, f"{name} fits one Spark at its own settings"


def test_the_parsers_are_each_engines_own_names():
    assert (recipe("gpt-oss-120b").settings["tool_call_parser"], recipe("gpt-oss-120b").settings["reasoning_parser"]) \
        == ("openai", "openai_gptoss")  # vLLM's
    sglang = parse_settings("a", host_data(recipe="qwen3.5-35b-a3b-fp8-sglang"))
    assert (sglang.engine, sglang.engine_image, sglang.sglang_version) == ("sglang", "lmsysorg/sglang:spark", "0.5.23")
    assert (sglang.tool_call_parser, sglang.reasoning_parser) == ("qwen3_coder", "qwen3")  # SGLang's
    assert sglang.attention_backend is None and sglang.limit_mm_per_prompt is None  # vLLM-only, set neutral
    assert recipe("qwen3.5-35b-a3b-fp8-sglang").measured == {"source": recipe("qwen3.5-35b-a3b-fp8-sglang")
                                                                      .measured["source"]}  # none from vLLM


def test_a_recipe_for_an_unknown_engine_or_without_its_version_is_refused(tmp_path):
    base = 'name = "x"\nkind = "chat"\n[model]\nrepo = "a/b"\nweight_bytes = 1\n[settings]\n'
    for body, needle in [('engine = "tgi"\n', "`engine` = 'tgi' is not one of vllm, sglang, llamacpp"),
                         ('engine = "sglang"\nengine_image = "lmsysorg/sglang:spark"\n',
                          "an sglang recipe sets `engine_image` and `sglang_version`"),
                         ('engine = "sglang"\nengine_image = "vllm/vllm-openai:v0.33.0"\nsglang_version = "0.5.23"\n',
                          "is vllm's image, and this recipe's engine is sglang: set an image of lmsysorg/sglang"),
                         ('engine_image = "vllm/vllm-openai:v0.33.0"\nvllm_version = "0.34.0"\n',
                          "tag v0.33.0 is not `vllm_version` 0.34.0")]:
        (tmp_path / "x.toml").write_text(base + body)
        with pytest.raises(ValueError, match="recipe file x.toml: ") as caught:
            catalogue(tmp_path)
        assert needle in str(caught.value)
    (tmp_path / "x.toml").write_text('name = "x"\nkind = "chat"\nneutral = ["max_model_len"]\n'
                                     '[model]\nrepo = "a/b"\nweight_bytes = 1\n')
    with pytest.raises(ValueError, match="`neutral` lists settings of tool_call_parser"):
        catalogue(tmp_path)


# ---- another model inherits no model-specific setting ----------------------------------------------

def test_a_model_no_recipe_knows_gets_neutral_settings_not_the_default_recipes():
    s = parse_settings("a", host_data(model_repo="Qwen/Qwen3-8B"))
    assert (s.tool_call_parser, s.reasoning_parser, s.enable_auto_tool_choice) == (None, None, False)
    assert (s.attention_backend, s.limit_mm_per_prompt) == (None, None)
    assert (s.speculative_method, s.num_speculative_tokens) == (None, None)
    assert s.served_model_name == "Qwen3-8B"  # its own name, not Qwen3.5-35B-A3B
    assert s.max_model_len == DEFAULTS["max_model_len"]  # kept: the planner refuses one above the model's maximum


def test_what_the_user_set_beside_another_model_is_kept():
    s = parse_settings("a", host_data(model_repo="Qwen/Qwen3-8B", tool_call_parser="hermes",
                                      enable_auto_tool_choice=True, served_model_name="qwen",
                                      **{USER_SET_KEY: ["enable_auto_tool_choice"]}))  # as --data marks it
    assert (s.tool_call_parser, s.enable_auto_tool_choice, s.served_model_name) == ("hermes", True, "qwen")
    assert s.reasoning_parser is None


def test_the_recipes_own_model_keeps_the_recipes_settings():
    named = host_data(model_repo=DEFAULTS["model_repo"], **{USER_SET_KEY: ["model_repo"]})
    assert parse_settings("a", named) == parse_settings("a", host_data())
    mtp = parse_settings("a", host_data(recipe="qwen3.5-35b-a3b-fp8-mtp", model_repo="Qwen/Qwen3.5-35B-A3B-FP8",
                                        **{USER_SET_KEY: ["model_repo", "recipe"]}))
    assert (mtp.speculative_method, mtp.tool_call_parser) == ("mtp", "qwen3_coder")


def test_another_model_under_a_recipe_drops_that_recipes_speculative_decoding():
    s = parse_settings("a", host_data(recipe="qwen3.5-35b-a3b-fp8-mtp", model_repo="Acme/Other-7B"))
    assert (s.speculative_method, s.num_speculative_tokens, s.tool_call_parser) == (None, None, None)
    assert s.recipe == "qwen3.5-35b-a3b-fp8-mtp"


def test_a_recipe_of_another_model_starts_from_neutral_not_from_the_default_model():
    s = parse_settings("a", host_data(recipe="llama-3.3-70b-nvfp4"))
    assert (s.tool_call_parser, s.reasoning_parser, s.attention_backend, s.limit_mm_per_prompt) == \
        ("llama3_json", None, None, None)
    big = parse_settings("a", host_data(recipe="qwen3-235b-a22b-gptq-int4"))  # states what it inherited before
    assert (big.tool_call_parser, big.enable_auto_tool_choice, big.attention_backend) == ("hermes", True, "FLASH_ATTN")


# ---- sparkfleet recipes ------------------------------------------------------------------------------

def test_sparkfleet_recipes_json_lists_every_recipe_with_fit_and_sourced_speed(capsys):
    assert cli.main(["recipes", "--json"]) == 0
    entries = {e["name"]: e for e in json.loads(capsys.readouterr().out)["recipes"]}
    assert set(entries) == set(ALL)
    assert entries["qwen3-235b-a22b-gptq-int4"]["sparks_needed"] == 2
    oss = entries["gpt-oss-120b"]
    assert (oss["engine"], oss["model_repo"], oss["sparks_needed"]) == ("vllm", "openai/gpt-oss-120b", 1)
    assert oss["measured"]["decode_tokens_per_s"] == 57.5 and "kubis.ai" in oss["measured"]["source"]
    assert entries["qwen3.5-35b-a3b-fp8"]["roofline_tokens_per_s"] > 50.3
    # A format the planner does not read yet says so instead of printing a bound below the measured speed.
    assert "roofline_tokens_per_s" not in entries["llama-3.3-70b-nvfp4"]
    assert "does not read" in entries["llama-3.3-70b-nvfp4"]["roofline_problem"]
    assert entries["qwen3-embedding-0.6b"]["sparks_needed"] is None


def test_sparkfleet_recipes_prints_a_table(capsys):
    assert cli.main(["recipes"]) == 0
    out = capsys.readouterr().out
    assert "gpt-oss-120b-llamacpp" in out and "needs 2 Sparks" in out and "llamacpp" in out
