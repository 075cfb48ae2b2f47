"""Plans with no hub: the recipe catalogue's facts give the full fit; the hub's manifest wins when it answers;
an uncatalogued model says what it cannot know. Figures worked by hand from recipes/qwen3.5-35b-a3b-fp8.toml."""

from __future__ import annotations

import json

import pytest

from sparkfleet import cli
from sparkfleet.model.manifest import Manifest, ManifestFile
from sparkfleet.release.plan import plan_hosts
from sparkfleet.contract.settings import SettingsError

from .helpers import ROOT, host_data, qwen35_config

OFFICE = str(ROOT / "inventory/office.py")
RECIPE_WEIGHTS = 37_454_687_456
# Budget at 0.88 of 128e9 = 112,640,000,000; minus the recipe's weights and the 3 GiB reserve (3,221,225,472):
KV_MEMORY = 112_640_000_000 - RECIPE_WEIGHTS - 3_221_225_472  # = 71,964,087,072
STATE = 64_389_120  # one sequence's Gated DeltaNet state (30 layers x 2,146,304)


def offline(s):
    return None, None, "hub unreachable (no network in this test)"


def test_the_offline_plan_of_the_default_release_has_the_full_fit():
    [plan] = plan_hosts([("a", host_data())], resolve=None)
    fit = plan.fit
    assert plan.weights_source == "recipe" and plan.unknown is None
    assert fit.weights_bytes == RECIPE_WEIGHTS and fit.kv_memory_bytes == KV_MEMORY == 71_964_087_072
    assert fit.kv_bytes_per_token == 20_480
    assert fit.largest_context == 262_144 and fit.fits
    # 262,144 x 20,480 + 64,389,120 = 5,433,098,240 per sequence: 71,964,087,072 / that = 13.2
    assert fit.seqs_at_max_model_len == 13
    # 8,192 x 20,480 + 64,389,120 = 232,161,280: 309.97
    assert fit.seqs_at_8192 == 309
    # 3,545,527,552 bytes read per token (test_fit): 273e9 / that = 77.0 tokens/s
    assert fit.decode_tokens_per_s_at_0 == pytest.approx(76.998, abs=0.001)


def test_an_unfit_context_is_refused_offline_with_the_largest_that_fits():
    # 0.32 x 128e9 = 40,960,000,000 - weights - reserve = 284,087,072 of KV memory;
    # (284,087,072 - 64,389,120) / 20,480 = 10,727 tokens, rounded down to 10,240.
    with pytest.raises(SettingsError) as caught:
        plan_hosts([("spark-a", host_data(gpu_memory_utilization=0.32))], resolve=None)
    [problem] = caught.value.problems
    assert problem.startswith("spark-a: max_model_len=262144 needs 5.1 GiB of KV cache per sequence but only "
                              "0.3 GiB is left")
    assert problem.endswith("set max_model_len <= 10240 (or raise gpu_memory_utilization)")
    [plan] = plan_hosts([("spark-a", host_data(gpu_memory_utilization=0.32, max_model_len=10240))], resolve=None)
    assert plan.fit.fits and plan.fit.largest_context == 10_727


def test_the_hubs_manifest_wins_over_the_recipe():
    files = tuple(ManifestFile(f"model-{i:05d}-of-00014.safetensors", 2_500_000_000, sha256=f"{i:064x}")
                  for i in range(1, 15)) + (ManifestFile("config.json", 4000, blob_sha1="c" * 40),)
    manifest = Manifest("modelscope", "Qwen/Qwen3.5-35B-A3B-FP8", "master", "f" * 40, files)
    [plan] = plan_hosts([("a", host_data())], resolve=lambda s: (manifest, qwen35_config(), None))
    assert plan.weights_source == "manifest" and plan.fit.weights_bytes == 35_000_000_000


def test_an_uncatalogued_model_offline_says_what_it_cannot_know():
    [plan] = plan_hosts([("a", host_data(model_repo="Acme/Unknown-7B"))], resolve=offline)
    assert plan.fit is None and plan.shape is None and plan.weights_source is None
    assert plan.unknown.startswith("hub unreachable (no network in this test), and no recipe in the catalogue "
                                   "knows Acme/Unknown-7B: its config.json (KV bytes per token")
    assert plan.to_dict()["fit"] is None and plan.to_dict()["unknown"] == plan.unknown


# ---- the command, through its main function, with no network ----------------------------------------

def test_plan_command_offline_prints_the_fit(capsys, monkeypatch):
    monkeypatch.setattr("sparkfleet.controller.inventory.hub_resolver", offline)
    assert cli.main(["plan", OFFICE, "--host", "spark-a"]) == 0
    out = " ".join(line.strip(" │") for line in capsys.readouterr().out.splitlines())  # unwrap the table's cells
    assert "measured with this recipe: 50.3 tokens/s (seed 000 write-up" in out
    assert "20,480 B/token" in out and "largest context 262,144; 13 sequences at 262,144, 309 at 8K" in out
    assert "weights 34.9 (recipe qwen3.5-35b-a3b-fp8, offline)" in out
    assert "<= 77.0 tokens/s (roofline at 273 GB/s)" in out


def test_plan_command_offline_refuses_a_small_share_with_exit_2(capsys, monkeypatch):
    monkeypatch.setattr("sparkfleet.controller.inventory.hub_resolver", offline)
    assert cli.main(["plan", OFFICE, "--host", "spark-a", "--data", "gpu_memory_utilization=0.32"]) == 2
    assert "spark-a: max_model_len=262144 needs" in capsys.readouterr().err


def test_plan_command_for_an_uncatalogued_model_offline(capsys, monkeypatch):
    monkeypatch.setattr("sparkfleet.controller.inventory.hub_resolver", offline)
    assert cli.main(["plan", OFFICE, "--host", "spark-a", "--data", "model_repo=Acme/Unknown-7B"]) == 0
    out = capsys.readouterr().out
    assert "unknown:" in out and "no memory fit and no roofline" in out and "B/token" not in out
    assert cli.main(["plan", OFFICE, "--host", "spark-a", "--data", "model_repo=Acme/Unknown-7B", "--json"]) == 0
    [host] = json.loads(capsys.readouterr().out)["hosts"]
    assert host["fit"] is None and "Acme/Unknown-7B" in host["unknown"] and host["weights_source"] is None
