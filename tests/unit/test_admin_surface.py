"""Settings that open vLLM's admin surface, or let the hub's code run, are refused by `plan` (issue 19, item 2).

Each case goes through the planner (`plan_hosts`), which is what `sparkfleet plan` and deploy.py call; the
CLI's exit code for the same refusals is checked in test_hostile_settings.py.
"""

import dataclasses

import pytest

from sparkfleet.contract import recipes
from sparkfleet.release import plan as plan_module
from sparkfleet.release import services as services_module
from sparkfleet.release.engines.vllm import ADMIN_FLAGS, flag_table
from sparkfleet.release.plan import plan_hosts
from sparkfleet.contract.settings import ADMIN_ENV, SettingsError

from .helpers import host_data

RECIPE = "qwen3.5-35b-a3b-fp8"
EMBED = {"embed": {"recipe": "qwen3-embedding-0.6b"}}


def problems(**data) -> list[str]:
    with pytest.raises(SettingsError) as caught:
        plan_hosts([("spark-x", host_data(**data))])
    return caught.value.problems


def plans(**data):
    return plan_hosts([("spark-x", host_data(**data))])


@pytest.fixture
def remote_code_recipes(monkeypatch):
    """The catalogue with the chat recipe and the embedding recipe saying `trust_remote_code = true`."""
    real = recipes.catalogue()
    marked = {**real, **{name: dataclasses.replace(real[name], trust_remote_code=True)
                         for name in (RECIPE, "qwen3-embedding-0.6b")}}
    monkeypatch.setattr(plan_module, "catalogue", lambda: marked)
    monkeypatch.setattr(services_module, "recipe", lambda name: marked[name])


@pytest.mark.parametrize("key", sorted(ADMIN_ENV))
@pytest.mark.parametrize("value", ["1", "0", "true"])
def test_engine_env_that_opens_the_admin_surface_is_refused(key, value):
    [line] = problems(engine_env={key: value})
    assert line.startswith(f"spark-x: setting `engine_env['{key}'] (key)` is invalid: {key} ")
    assert ADMIN_ENV[key] in line and "remove it from engine_env" in line


def test_dev_mode_refusal_names_the_endpoints_it_would_open():
    [line] = problems(engine_env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_LOGGING_LEVEL": "INFO"})
    assert "/collective_rpc" in line and "/sleep" in line and "/reset_prefix_cache" in line


def test_every_refused_flag_is_a_flag_of_the_pinned_vllm():
    table = flag_table("0.33.0")
    assert set(ADMIN_FLAGS) | {"--trust-remote-code"} <= set(table.flags)


@pytest.mark.parametrize("args", [[flag] + (["x"] if flag_table("0.33.0").flags[flag].get("value") else [])
                                  for flag in sorted(ADMIN_FLAGS)])
def test_flags_that_open_an_admin_surface_are_refused(args):
    found = problems(extra_engine_args=args)
    assert any(line.startswith(f"spark-x: setting `extra_engine_args`: `{args[0]}` {ADMIN_FLAGS[args[0]]}: remove it")
               for line in found), found


@pytest.mark.parametrize("arg", ["--enable_log_requests", "--enable-log-requests=true"])
def test_spellings_vllm_reads_as_the_same_flag_are_refused(arg):
    assert any("`--enable-log-requests` logs each request's prompt" in line
               for line in problems(extra_engine_args=[arg]))


@pytest.mark.parametrize("arg", ["--trust-remote", "--enable-log-req", "--middle", "--profiler-config.profiler"])
def test_abbreviations_and_dotted_forms_vllm_would_expand_are_refused(arg):
    assert any(f"`{arg}` is not a flag of vLLM 0.33.0" in line for line in problems(extra_engine_args=[arg, "x"]))


def test_the_inverse_flags_stay_allowed():
    [plan] = plans(extra_engine_args=["--disable-log-requests", "--no-enable-log-outputs", "--no-trust-remote-code"])
    assert plan.engine_args[-3:] == ["--disable-log-requests", "--no-enable-log-outputs", "--no-trust-remote-code"]


@pytest.mark.parametrize("arg", ["--trust-remote-code", "--trust_remote_code"])
def test_trust_remote_code_is_refused_by_default(arg):
    [line] = [p for p in problems(extra_engine_args=[arg]) if "runs the model repository's Python" in p]
    assert line.startswith("spark-x: setting `extra_engine_args`: `--trust-remote-code` runs")
    assert "the recipe does not say `trust_remote_code = true`" in line
    assert "`allow_trust_remote_code` is not True" in line


def test_the_opt_in_alone_does_not_allow_trust_remote_code():
    [line] = problems(extra_engine_args=["--trust-remote-code"], allow_trust_remote_code=True)
    assert "the recipe does not say `trust_remote_code = true`" in line
    assert "allow_trust_remote_code` is not" not in line


def test_a_recipe_that_needs_it_still_needs_the_opt_in(remote_code_recipes):
    [line] = problems(extra_engine_args=["--trust-remote-code"])
    assert "`allow_trust_remote_code` is not True" in line and "the recipe does not" not in line


def test_trust_remote_code_with_the_recipe_and_the_opt_in_plans(remote_code_recipes):
    [plan] = plans(extra_engine_args=["--trust-remote-code"], allow_trust_remote_code=True)
    assert plan.engine_args[-1] == "--trust-remote-code"


def test_a_service_gets_the_same_refusals():
    found = problems(services={"embed": {"recipe": "qwen3-embedding-0.6b",
                                         "extra_engine_args": ["--trust-remote-code", "--enable-log-requests"]}})
    assert any(line.startswith("spark-x: service 'embed': extra_engine_args: `--trust-remote-code` runs")
               for line in found), found
    assert any("service 'embed': extra_engine_args: `--enable-log-requests` logs" in line for line in found), found


def test_a_service_recipe_that_needs_remote_code_plans_with_the_opt_in(remote_code_recipes):
    [plan] = plans(services={"embed": {"recipe": "qwen3-embedding-0.6b", "extra_engine_args": ["--trust-remote-code"]}},
                   allow_trust_remote_code=True)
    assert plan.services[0].engine_args[-1] == "--trust-remote-code"


def test_recipe_trust_remote_code_must_be_a_boolean(tmp_path):
    (tmp_path / "x.toml").write_text('name = "x"\nkind = "chat"\ntrust_remote_code = "yes"\n'
                                     '[model]\nrepo = "a/b"\nweight_bytes = 1\n')
    with pytest.raises(ValueError, match="`trust_remote_code` must be true or false"):
        recipes.catalogue(tmp_path)
