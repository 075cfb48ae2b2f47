"""The speed profile in the planner: MTP speculative decoding's flags and the draft's memory, by hand."""

from __future__ import annotations

import copy
import json

import pytest

from sparkfleet import cli
from sparkfleet.model.fit import check_fit, draft_weight_bytes, fit_report
from sparkfleet.release.engines.vllm import flag_table
from sparkfleet.release.plan import plan_hosts
from sparkfleet.contract.settings import SettingsError

from .helpers import ROOT, host_data, qwen35_config

MTP = "qwen3.5-35b-a3b-fp8-mtp"
WEIGHTS = 37_454_687_456  # the recipe's safetensors total (it holds the mtp.* tensors)
KV_MEMORY = 71_964_087_072  # 112,640,000,000 budget - WEIGHTS - 3 GiB reserve
# The draft (one MTP layer): attention q 2048x8192 + k, v 2048x512 each + o 4096x2048 = 27,262,976 FP8;
# experts 257 x 3 x 2048 x 512 = 808,452,096 FP8; fc 2 x 2048 x 2048 + router 2048 x 256 + shared gate 2048
# + q/k norms 2 x 256 + 5 norms x 2048 = 8,925,696 bf16 = 17,851,392 bytes. Total 853,566,464.
DRAFT_WEIGHTS = 27_262_976 + 808_452_096 + 2 * 8_925_696
DRAFT_KV = 1 * 2 * 2 * 256 * 2  # 1 layer x (K, V) x 2 KV heads x 256 x bf16 = 2,048 bytes per token
STATE = 64_389_120


def test_the_draft_layers_weights_from_the_config():
    assert draft_weight_bytes(qwen35_config()) == DRAFT_WEIGHTS == 853_566_464
    no_mtp = copy.deepcopy(qwen35_config())
    del no_mtp["text_config"]["mtp_num_hidden_layers"]
    assert draft_weight_bytes(no_mtp) == 0


def test_two_draft_tokens_cost_the_draft_kv_and_two_more_linear_states():
    r = fit_report(qwen35_config(), WEIGHTS, num_speculative_tokens=2)
    assert (r.num_speculative_tokens, r.draft_layers) == (2, 1)
    assert r.draft_weights_bytes == 853_566_464
    assert r.kv_bytes_per_token == 20_480 and r.draft_kv_bytes_per_token == DRAFT_KV == 2_048
    assert r.kv_bytes_per_token_total == 22_528
    assert r.linear_state_bytes == 3 * STATE == 193_167_360  # the running state + one per draft position
    assert r.kv_memory_bytes == KV_MEMORY
    # per sequence at 262,144: 262,144 x 22,528 + 193,167,360 = 6,098,747,392 -> 11.8 sequences
    assert r.seqs_at_max_model_len == 11
    # at 8,192: 184,549,376 + 193,167,360 = 377,716,736 -> 190.5
    assert r.seqs_at_8192 == 190
    assert r.draft_memory_bytes == 853_566_464 + 262_144 * 2_048
    # The roofline stays the plain one (speculative decoding may exceed it).
    assert r.decode_tokens_per_s_at_0 == fit_report(qwen35_config(), WEIGHTS).decode_tokens_per_s_at_0


def test_the_draft_shrinks_the_largest_context_that_fits():
    # 0.33 x 128e9 = 42,240,000,000 - WEIGHTS - 3 GiB = 1,564,087,072 of KV memory.
    plain = fit_report(qwen35_config(), WEIGHTS, gpu_memory_utilization=0.33)
    fast = fit_report(qwen35_config(), WEIGHTS, gpu_memory_utilization=0.33, num_speculative_tokens=2)
    assert plain.largest_context == (1_564_087_072 - STATE) // 20_480 == 73_227
    assert fast.largest_context == (1_564_087_072 - 3 * STATE) // 22_528 == 60_854
    assert check_fit(fast).endswith("set max_model_len <= 60416 (or raise gpu_memory_utilization)")


def test_a_model_without_mtp_layers_cannot_be_planned_with_mtp():
    no_mtp = copy.deepcopy(qwen35_config())
    del no_mtp["text_config"]["mtp_num_hidden_layers"]
    with pytest.raises(ValueError, match="no MTP layer"):
        fit_report(no_mtp, WEIGHTS, num_speculative_tokens=2)
    with pytest.raises(SettingsError, match='a: speculative_method="mtp" but Qwen/Qwen3.5-35B-A3B-FP8 has no MTP '
                                            "layer"):
        plan_hosts([("a", host_data(recipe=MTP))], resolve=lambda s: (None, no_mtp, "hub down"))


def test_the_speed_profile_plans_offline_with_flags_the_table_accepts():
    [plan] = plan_hosts([("a", host_data(recipe=MTP))], resolve=None)
    i = plan.engine_args.index("--speculative-config")
    assert json.loads(plan.engine_args[i + 1]) == {"method": "mtp", "num_speculative_tokens": 2}
    assert flag_table("0.33.0").problems(plan.engine_args) == []
    assert plan.fit.num_speculative_tokens == 2 and plan.fit.seqs_at_max_model_len == 11
    assert plan.to_dict()["speculative"] == {"method": "mtp", "num_speculative_tokens": 2}
    assert '--speculative-config "{\\"method\\": \\"mtp\\", \\"num_speculative_tokens\\": 2}"' in plan.render_unit()


@pytest.mark.parametrize("data,needle", [
    ({"speculative_method": "mtp"}, "a: speculative_method='mtp' needs num_speculative_tokens"),
    ({"num_speculative_tokens": 2}, "a: num_speculative_tokens=2 without speculative_method"),
    ({"speculative_method": "eagle3", "num_speculative_tokens": 2}, "setting `speculative_method` = 'eagle3'"),
    ({"recipe": MTP, "num_speculative_tokens": 9}, "setting `num_speculative_tokens` = 9 is invalid"),
    ({"extra_engine_args": ["--speculative-config", "{}"]}, "set `speculative_method` instead"),
])
def test_bad_speculative_settings_are_refused(data, needle):
    with pytest.raises(SettingsError) as caught:
        plan_hosts([("a", host_data(**data))], resolve=None)
    assert any(needle in problem for problem in caught.value.problems), caught.value.problems


def test_plan_command_shows_the_speculative_flags_and_the_draft(capsys, monkeypatch):
    monkeypatch.setattr("sparkfleet.controller.inventory.hub_resolver", lambda s: (None, None, "hub down"))
    assert cli.main(["plan", str(ROOT / "inventory/office.py"), "--host", "spark-a", "--data", f"recipe={MTP}"]) == 0
    out = " ".join(line.strip(" │") for line in capsys.readouterr().out.splitlines())  # unwrap the table's cells
    assert '--speculative-config {"method": "mtp",' in out
    assert "1 MTP layer(s), 2 draft tokens/step: weights 0.79 GiB (inside the checkpoint's), KV +2,048 B/token" in out
    assert "so it may exceed this plain roofline" in out
