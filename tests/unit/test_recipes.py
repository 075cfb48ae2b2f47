"""The recipe catalogue (recipes/*.toml) and how a host chooses one: defaults < recipe < what the user set."""

from __future__ import annotations

import tomllib

import pytest

from sparkfleet.controller.inventory import load_hosts
from sparkfleet.contract import recipes
from sparkfleet.contract.recipes import catalogue, known_model, recipe
from sparkfleet.contract import settings as settings_module
from sparkfleet.contract.settings import USER_SET_KEY, SettingsError, parse_settings

from .helpers import DEFAULTS, ROOT, host_data

DEFAULT = "qwen3.5-35b-a3b-fp8"
MTP = "qwen3.5-35b-a3b-fp8-mtp"


def test_the_catalogue_holds_the_default_release_and_its_speed_profile():
    chat = {name for name, r in catalogue().items() if r.kind == "chat"}
    assert {DEFAULT, MTP} <= chat
    assert DEFAULTS["recipe"] == DEFAULT


def test_the_default_recipe_changes_no_default():
    """Choosing the default recipe must not move any default: each of its settings equals group_data/all.py's."""
    chosen = recipe(DEFAULT).settings
    assert set(chosen) >= {"model_repo", "model_revision", "served_model_name", "max_model_len",
                           "gpu_memory_utilization", "engine_image", "vllm_version"}
    assert {key: DEFAULTS[key] for key in chosen} == chosen
    assert parse_settings("a", host_data()) == parse_settings("a", host_data(recipe=DEFAULT))


def test_the_default_model_is_known_offline():
    facts = known_model("Qwen/Qwen3.5-35B-A3B-FP8")
    assert facts.weight_bytes == 37_454_687_456
    text = facts.config["text_config"]
    assert text["layer_types"][3::4] == ["full_attention"] * 10 and len(text["layer_types"]) == 40
    assert (text["num_key_value_heads"], text["head_dim"], text["mtp_num_hidden_layers"]) == (2, 256, 1)
    assert known_model("Acme/Unknown-7B") is None


def test_the_speed_profile_extends_the_default():
    fast = recipe(MTP)
    assert fast.settings["speculative_method"] == "mtp" and fast.settings["num_speculative_tokens"] == 2
    assert fast.settings["model_repo"] == "Qwen/Qwen3.5-35B-A3B-FP8"
    assert fast.model == recipe(DEFAULT).model
    assert fast.measured["decode_tokens_per_s"] == 58.4 and fast.measured["aggregate_tokens_per_s_at_16"] == 270
    assert any("inference-atlas" in source for source in fast.sources)


@pytest.mark.parametrize("name", sorted(n for n, r in catalogue().items() if r.kind == "chat"))
def test_every_chat_recipe_is_valid_settings(name):
    s = parse_settings("a", host_data(recipe=name))
    assert s.recipe == name and s.model_repo == recipe(name).settings["model_repo"]


def test_an_unknown_recipe_is_refused_listing_the_catalogue():
    with pytest.raises(SettingsError) as caught:
        parse_settings("spark-a", host_data(recipe="qwen9"))
    [problem] = caught.value.problems
    assert problem.startswith("spark-a: setting `recipe` = 'qwen9' is invalid: no such recipe")
    assert f"qwen3-235b-a22b-gptq-int4, qwen3-8b-gguf, qwen3-coder-30b-a3b-fp8, {DEFAULT}, {MTP}," in problem
    with pytest.raises(ValueError, match=f"no recipe named 'qwen9'; the catalogue has: .*{DEFAULT}"):
        recipe("qwen9")


# ---- precedence: defaults < recipe < the user's ---------------------------------------------------

def test_the_recipe_beats_the_defaults_and_the_user_beats_the_recipe():
    assert parse_settings("a", host_data(recipe=MTP)).num_speculative_tokens == 2
    assert parse_settings("a", host_data(recipe=MTP, num_speculative_tokens=1)).num_speculative_tokens == 1
    assert parse_settings("a", host_data(recipe=MTP, max_model_len=65536)).max_model_len == 65536


@pytest.fixture
def small_catalogue(tmp_path, monkeypatch):
    """A catalogue of two recipes: a chat recipe that moves max_model_len, and an embedding recipe."""
    (tmp_path / "short.toml").write_text(
        'name = "short"\nkind = "chat"\n[settings]\nmax_model_len = 131072\nserved_model_name = "short"\n'
        '[model]\nrepo = "Qwen/Qwen3.5-35B-A3B-FP8"\nweight_bytes = 1\n')
    (tmp_path / "embed.toml").write_text(
        'name = "embed"\nkind = "embedding"\n[model]\nrepo = "Qwen/Qwen3-Embedding-0.6B"\nweight_bytes = 1\n')
    monkeypatch.setattr(settings_module, "catalogue", lambda: catalogue(tmp_path))
    return tmp_path


def test_a_value_the_user_named_wins_even_when_it_equals_the_default(small_catalogue):
    # A value equal to the default, from the "all" layer: the default, so the recipe moves it.
    assert parse_settings("a", host_data(recipe="short")).max_model_len == 131072
    # The same value named by the host's inventory entry (or a group, or --data): the user's.
    named = host_data(recipe="short", **{USER_SET_KEY: ["max_model_len"]})
    assert parse_settings("a", named).max_model_len == 262144
    assert parse_settings("a", named).served_model_name == "short"


def test_a_host_cannot_serve_an_embedding_recipe(small_catalogue):
    with pytest.raises(SettingsError, match="'embed' is invalid: its kind is 'embedding', and a host's recipe is a "
                                            r"chat recipe \(services take the others\); choose one of: short"):
        parse_settings("a", host_data(recipe="embed"))


def test_the_inventory_layers_mark_what_the_user_set(tmp_path):
    """Host data, group data (the inventory's group_data/) and nothing from the defaults file."""
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "sparks.py").write_text("gpu_memory_utilization = 0.88\n")
    inventory = tmp_path / "fleet.py"
    inventory.write_text("sparks = [('s1', {'max_model_len': 262144, 'recipe': 'qwen3.5-35b-a3b-fp8-mtp'})]\n")
    [(name, data)] = load_hosts(str(inventory))
    assert name == "s1" and data["served_model_name"] == "Qwen3.5-35B-A3B"  # the defaults file is merged in
    assert {"max_model_len", "recipe", "gpu_memory_utilization"} <= set(data[USER_SET_KEY])
    assert "served_model_name" not in data[USER_SET_KEY]
    assert parse_settings(name, data).speculative_method == "mtp"


# ---- the loader refuses malformed files, naming them -------------------------------------------------

@pytest.mark.parametrize("text,needle", [
    ('name = "other"\nkind = "chat"\n[model]\nrepo = "a/b"\nweight_bytes = 1\n', "`name` must equal the file name"),
    ('name = "bad"\nkind = "vision"\n[model]\nrepo = "a/b"\nweight_bytes = 1\n', "`kind` must be one of"),
    ('name = "bad"\nkind = "chat"\n[model]\nrepo = "a/b"\n', "`weight_bytes` must be a positive integer"),
    ('name = "bad"\nkind = "chat"\n', "needs a [model] table"),
    ('name = "bad"\nkind = "chat"\nextends = "bad"\n', "`extends` must name another recipe"),
    ('name = "bad"\nkind = "chat"\nextends = "missing"\n', "names 'missing', which has no missing.toml"),
    ('name = "bad"\nkind = = "chat"\n', "cannot be read"),
])
def test_a_malformed_recipe_file_is_named(tmp_path, text, needle):
    (tmp_path / "bad.toml").write_text(text)
    with pytest.raises(ValueError, match="recipe file bad.toml: ") as caught:
        catalogue(tmp_path)
    assert needle in str(caught.value)


def test_the_catalogue_is_packaged_with_sparkfleet():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert project["package-dir"]["sparkfleet.recipes"] == "recipes"
    assert "sparkfleet.recipes" in project["packages"]
    assert project["package-data"]["sparkfleet.recipes"] == ["*.toml"]
    assert recipes.RECIPES_DIR == ROOT / "recipes"
