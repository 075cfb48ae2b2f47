"""The SGLang and llama.cpp flag tables, the llama-server help parser, and the key variable per engine."""

from sparkfleet.contract import formats
from sparkfleet.contract.shared import envfiles
from sparkfleet.release.engines import ENGINE_CLASSES
from tools.gen_llamacpp_flag_table import parse_help

HELP = """----- common params -----

-c,    --ctx-size N                     size of the prompt context (default: 0, 0 = loaded from model)
                                        (env: LLAMA_ARG_CTX_SIZE)
-fa,   --flash-attn [on|off|auto]       set Flash Attention use ('on', 'off', or 'auto', default: 'auto')
--rope-scaling {none,linear,yarn}       RoPE frequency scaling method
--jinja, --no-jinja                     whether to use jinja template engine for chat (default: enabled)
                                        (env: LLAMA_ARG_JINJA)
--spec-draft-ngl, -ngld, --gpu-layers-draft, --n-gpu-layers-draft N
                                        number of layers to store in VRAM for the draft model
--metrics                               enable prometheus compatible metrics endpoint (default: disabled)
"""


def test_the_help_parser_reads_spellings_values_choices_and_env():
    flags = parse_help(HELP)
    assert flags["-c"] == {"value": True, "dest": "ctx_size", "alias_of": "--ctx-size", "env": "LLAMA_ARG_CTX_SIZE"}
    assert flags["--flash-attn"]["value"] == "optional" and flags["-fa"]["choices"] == ["on", "off", "auto"]
    assert flags["--rope-scaling"]["choices"] == ["none", "linear", "yarn"]
    assert flags["--no-jinja"] == {"value": False, "negates": "--jinja", "dest": "jinja", "env": "LLAMA_ARG_JINJA"}
    assert flags["-ngld"]["alias_of"] == "--spec-draft-ngl" and flags["--n-gpu-layers-draft"]["value"] is True
    assert flags["--metrics"] == {"value": False, "dest": "metrics"}


def test_an_optional_value_is_consumed_only_when_it_is_a_choice():
    table = ENGINE_CLASSES["llamacpp"].flag_table("11669")
    assert table.problems(["-fa", "on", "--metrics"]) == [] and table.problems(["-fa", "--metrics"]) == []
    assert table.flags["--api-key"]["env"] == "LLAMA_API_KEY"


def test_sglang_table_is_its_own_parser():
    table = ENGINE_CLASSES["sglang"].flag_table("0.5.23")
    assert {"qwen3_coder", "gpt-oss", "hermes"} <= set(table.flags["--tool-call-parser"]["choices"])
    assert {"qwen3", "gpt-oss"} <= set(table.flags["--reasoning-parser"]["choices"])
    assert table.flags["--tp-size"]["dest"] == "tp_size"
    assert table.problems(["--enable-metrics", "--context-length", "4096", "--tp", "1"]) == [
        "`--tp` is not a flag of SGLang 0.5.23: remove it or pin another sglang_version"]


def test_the_env_file_writes_the_key_under_the_engines_name():
    assert "LLAMA_API_KEY=sk-k" in formats.engine_env("sk-k", {}, ENGINE_CLASSES["llamacpp"].key_var).splitlines()
    for var in formats.API_KEY_VARS:
        assert envfiles.engine_api_key({var: "sk-k"}) == "sk-k"
    assert envfiles.engine_api_key({}) is None
    kept = envfiles.env_kept("LLAMA_API_KEY=sk-k\nOTHER=1\n", {})
    assert "sk-k" not in kept and "LLAMA_API_KEY" not in kept
