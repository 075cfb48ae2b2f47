"""The memory and speed planner, against numbers computed by hand for Qwen3.5-35B-A3B-FP8."""

import pytest

from sparkfleet.model.fit import (
    GIB,
    RESERVE_BYTES,
    SPARK_MEMORY_BYTES,
    check_fit,
    fit_report,
    kv_bytes_per_token,
    linear_state_bytes,
    param_counts,
)

from .helpers import qwen35_config

# The manifest total the tests use for the FP8 checkpoint (~35 GB of safetensors).
WEIGHTS = 35_000_000_000


def test_the_known_config_has_full_attention_every_fourth_layer():
    assert qwen35_config()["text_config"]["layer_types"][3::4] == ["full_attention"] * 10
    assert qwen35_config()["text_config"]["layer_types"].count("linear_attention") == 30


# ---- by hand ---------------------------------------------------------------
# KV per token: 2 (K, V) x 10 full-attention layers x 2 KV heads x 256 x 2 bytes (bf16)
KV_BF16 = 2 * 10 * 2 * 256 * 2  # = 20,480
KV_FP8 = 2 * 10 * 2 * 256 * 1  # = 10,240
# Linear state per sequence, per DeltaNet layer:
#   recurrent fp32: 32 value heads x 128 x 128 x 4 bytes          = 2,097,152
#   conv bf16: (4 - 1) x (16 x 128 x 2 + 32 x 128 = 8,192) x 2    =    49,152
#   per layer 2,146,304; x 30 layers = 64,389,120 bytes = 61.4 MiB ("~61 MiB")
STATE = 30 * (32 * 128 * 128 * 4 + 3 * (16 * 128 * 2 + 32 * 128) * 2)  # = 64,389,120
# Budget at 0.88 of 128e9: 112,640,000,000 bytes (104.9 GiB).
BUDGET = 112_640_000_000
# KV memory = budget - 35e9 weights - 3 GiB reserve (2 GiB activations + 1 GiB CUDA graphs)
#           = 112,640,000,000 - 35,000,000,000 - 3,221,225,472 = 74,418,774,528 (69.3 GiB)
KV_MEMORY = 74_418_774_528
# Largest ONE sequence: (74,418,774,528 - 64,389,120) / 20,480 = 3,630,585 tokens,
# capped at max_position_embeddings 262,144.
# Sequences at 262,144: each 262,144 x 20,480 + 64,389,120 = 5,433,098,240 bytes (5.06 GiB);
#   74,418,774,528 / 5,433,098,240 = 13.7 -> 13.
# Sequences at 8,192: each 8,192 x 20,480 + 64,389,120 = 232,161,280; 74,418,774,528 / that = 320.5 -> 320.
#
# Parameters (text model, no vision tower or MTP head):
#   full attention, per layer: q 2048 x (16 x 256 x 2: gated) = 16,777,216; k, v 2048 x 512 = 1,048,576 each;
#     o 4096 x 2048 = 8,388,608 (all FP8) + q/k norms 2 x 256 (bf16)          -> 27,262,976 fp8 + 512 bf16
#   Gated DeltaNet, per layer: in_proj_qkvz 2048 x (2x2048 + 2x4096) = 25,165,824; out_proj 4096 x 2048
#     = 8,388,608 (FP8); in_proj_ba 2048 x 64 = 131,072, conv1d 8,192 x 4 = 32,768, A_log + dt_bias 64,
#     norm 128 (bf16)                                                         -> 33,554,432 fp8 + 164,032 bf16
#   MoE, per layer: one expert 3 x 2048 x 512 = 3,145,728 (FP8); router 2048 x 256 = 524,288 and
#     shared-expert gate 2048 (bf16); active 8 routed + 1 shared           -> 28,311,552 fp8 + 526,336 bf16
#   norms 2 x 2048 x 40 + 2048 = 165,888; lm_head 248,320 x 2048 = 508,559,360 (bf16), embedding the same
#     in total but one row (2048) per token.
# Active FP8 = 10 x 27,262,976 + 30 x 33,554,432 + 40 x 28,311,552 = 2,411,724,800
# Active bf16 = 10 x 512 + 30 x 164,032 + 40 x 526,336 + 165,888 + 508,559,360 + 2048 = 534,706,816
ACTIVE_FP8 = 10 * 27_262_976 + 30 * 33_554_432 + 40 * 28_311_552
ACTIVE_BF16 = 10 * 512 + 30 * 164_032 + 40 * 526_336 + 165_888 + 508_559_360 + 2048
ACTIVE = ACTIVE_FP8 + ACTIVE_BF16  # = 2,946,431,616 ("A3B")
# Total: every expert (256 + shared) and the whole embedding:
TOTAL = (
    10 * (27_262_976 + 512)
    + 30 * (33_554_432 + 164_032)
    + 40 * (257 * 3_145_728 + 524_288 + 2048)
    + 165_888
    + 2 * 508_559_360
)  # = 34,660,610,688
# Roofline: weights read per token = 2,411,724,800 x 1 + 534,706,816 x 2 = 3,481,138,432 bytes;
#   at context 0: + 64,389,120 state = 3,545,527,552 -> 273e9 / that = 77.0 tokens/s
#   at 8,192:     + 8,192 x 20,480 = 167,772,160 -> 3,713,299,712 -> 73.5 tokens/s
WEIGHT_READ = ACTIVE_FP8 * 1 + ACTIVE_BF16 * 2


def test_hand_computed_constants():
    assert (KV_BF16, KV_FP8, STATE) == (20_480, 10_240, 64_389_120)
    assert round(STATE / 2**20, 1) == 61.4
    assert (ACTIVE, TOTAL, WEIGHT_READ) == (2_946_431_616, 34_660_610_688, 3_481_138_432)
    assert RESERVE_BYTES == 3 * GIB
    assert SPARK_MEMORY_BYTES == 128 * 10**9


def test_kv_bytes_per_token_counts_full_attention_layers_only():
    config = qwen35_config()
    assert kv_bytes_per_token(config) == KV_BF16
    assert kv_bytes_per_token(config, "fp8") == KV_FP8
    assert kv_bytes_per_token(config, "fp8_e4m3") == KV_FP8
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        kv_bytes_per_token(config, "int3")


def test_linear_state_is_about_61_mib():
    assert linear_state_bytes(qwen35_config()) == STATE


def test_param_counts():
    params = param_counts(qwen35_config())
    assert params.active == ACTIVE
    assert params.active_narrow == ACTIVE_FP8
    assert params.total == TOTAL
    assert 2.9e9 < params.active < 3.0e9  # "A3B"


def test_default_release_fits():
    r = fit_report(qwen35_config(), WEIGHTS, gpu_memory_utilization=0.88, max_model_len=262144)
    assert r.budget_bytes == BUDGET
    assert r.kv_memory_bytes == KV_MEMORY == BUDGET - WEIGHTS - RESERVE_BYTES
    assert r.kv_bytes_per_token == KV_BF16
    assert r.linear_state_bytes == STATE
    assert (r.full_attention_layers, r.linear_attention_layers) == (10, 30)
    assert r.largest_context == 262_144  # 3,630,585 uncapped
    assert r.fits
    assert r.seqs_at_max_model_len == 13
    assert r.seqs_at_8192 == 320
    assert check_fit(r) is None
    # The count from the config, as stored: FP8 = 10 x 27,262,976 + 30 x 33,554,432
    # + 40 x 257 x 3,145,728 = 33,617,346,560 bytes; bf16 = (34,660,610,688 - 33,617,346,560) x 2
    # = 2,086,528,256; together 35,703,874,816: close to the ~35-37.5 GB manifest (which also
    # holds the vision tower, the MTP head and the FP8 block scales).
    assert r.estimated_weights_bytes == 35_703_874_816


def test_decode_roofline():
    r = fit_report(qwen35_config(), WEIGHTS)
    assert r.active_params == ACTIVE
    assert r.total_params == TOTAL
    assert r.active_weight_bytes_per_token == WEIGHT_READ
    assert r.decode_bytes_per_token_at_0 == WEIGHT_READ + STATE == 3_545_527_552
    assert r.decode_bytes_per_token_at_context == 3_545_527_552 + 8192 * KV_BF16 == 3_713_299_712
    assert r.decode_tokens_per_s_at_0 == pytest.approx(77.0, abs=0.05)
    assert r.decode_tokens_per_s_at_context == pytest.approx(73.5, abs=0.05)
    # A longer context reads more KV: 131,072 x 20,480 = 2,684,354,560 more bytes -> 273e9 / 6,229,882,112 = 43.8
    assert fit_report(qwen35_config(), WEIGHTS, context=131072).decode_tokens_per_s_at_context == pytest.approx(
        43.8, abs=0.05
    )


def test_fp8_kv_cache_halves_per_token_cost():
    r = fit_report(qwen35_config(), WEIGHTS, kv_cache_dtype="fp8")
    assert r.kv_bytes_per_token == KV_FP8
    # Each 262,144-token sequence: 262,144 x 10,240 + 64,389,120 = 2,748,743,680 -> 74,418,774,528 / that = 27.07
    assert r.seqs_at_max_model_len == 27


def test_prefix_caching_copies_of_linear_state_cost_memory():
    r = fit_report(qwen35_config(), WEIGHTS, linear_state_copies=2)
    assert r.linear_state_bytes == 2 * STATE
    # 8,192-token sequences: 167,772,160 + 128,778,240 = 296,550,400 -> 74,418,774,528 / that = 250.9
    assert r.seqs_at_8192 == 250
    # The roofline still reads one state per token.
    assert r.decode_bytes_per_token_at_0 == WEIGHT_READ + STATE


def test_oversized_max_model_len_is_refused_with_the_largest_fitting_length():
    # At 0.33 of 128e9: budget 42,240,000,000; KV memory = 42,240,000,000 - 35e9 - 3,221,225,472
    #   = 4,018,774,528 (3.7 GiB); one sequence of 262,144 needs 5,433,098,240 (5.1 GiB): no fit.
    # Largest: (4,018,774,528 - 64,389,120) / 20,480 = 193,085.2 -> 193,085; down to a multiple
    #   of 1024: 188 x 1024 = 192,512.
    r = fit_report(qwen35_config(), WEIGHTS, gpu_memory_utilization=0.33, max_model_len=262144)
    assert r.kv_memory_bytes == 4_018_774_528
    assert r.largest_context == 193_085
    assert not r.fits
    assert r.seqs_at_max_model_len == 0
    message = check_fit(r)
    assert message is not None
    assert message.startswith("max_model_len=262144 needs 5.1 GiB of KV cache per sequence but only 3.7 GiB")
    assert "set max_model_len <= 192512" in message
    assert "gpu_memory_utilization" in message
    # The suggestion itself fits; the largest length fits and one more token does not.
    for length, fits in ((192512, True), (193085, True), (193086, False)):
        at = fit_report(qwen35_config(), WEIGHTS, gpu_memory_utilization=0.33, max_model_len=length)
        assert (check_fit(at) is None) is fits, length


def test_refusal_at_0_3_utilization():
    # 0.3 x 128e9 = 38.4e9; KV memory = 38.4e9 - 35e9 - 3,221,225,472 = 178,774,528 (0.2 GiB);
    # (178,774,528 - 64,389,120) / 20,480 = 5,585.2 -> 5,585 -> 5 x 1024 = 5,120.
    r = fit_report(qwen35_config(), WEIGHTS, gpu_memory_utilization=0.3)
    assert r.largest_context == 5585
    assert "set max_model_len <= 5120" in check_fit(r)


def test_nothing_fits_when_weights_exceed_the_budget():
    # 0.2 x 128e9 = 25.6e9 < 35e9 of weights.
    r = fit_report(qwen35_config(), WEIGHTS, gpu_memory_utilization=0.2)
    assert r.kv_memory_bytes < 0
    assert (r.largest_context, r.seqs_at_8192) == (0, 0)
    message = check_fit(fit_report(qwen35_config(), WEIGHTS, gpu_memory_utilization=0.2, max_model_len=8192))
    # on two Sparks each holds 17.5e9 of weights: 25.6e9 - 17.5e9 - 3 GiB leaves room for 8192 tokens
    assert "at gpu_memory_utilization=0.2" in message and message.endswith(
        "needs 2 Sparks: set tensor_parallel_hosts with 2 hosts and tensor_parallel_size = 2")
    # 0.02 x 128e9 = 2.56e9 is less than even an eighth of the weights (4.375e9): no number of Sparks helps
    message = check_fit(fit_report(qwen35_config(), WEIGHTS, gpu_memory_utilization=0.02, max_model_len=8192))
    assert "no max_model_len of 1024 or more fits" in message


def test_decode_roofline_at_any_context():
    # 273e9 / (3,545,527,552 + 640 x 20,480 = 3,558,634,752) = 76.71 tokens/s (bench's 512 + 128 tokens)
    r = fit_report(qwen35_config(), WEIGHTS)
    assert r.decode_tokens_per_s(640) == pytest.approx(76.71, abs=0.005)
    assert r.decode_tokens_per_s(8192) == r.decode_tokens_per_s_at_context


def test_max_model_len_defaults_to_the_model_maximum_and_max_num_seqs_caps_concurrency():
    r = fit_report(qwen35_config(), WEIGHTS, max_num_seqs=16)
    assert r.max_model_len == 262144
    assert r.concurrency(r.seqs_at_8192) == 16
    assert r.concurrency(r.seqs_at_max_model_len) == 13


def test_to_dict_is_plain_data():
    d = fit_report(qwen35_config(), WEIGHTS).to_dict()
    assert d["kv_bytes_per_token"] == KV_BF16
    assert d["linear_state_bytes"] == STATE
    assert d["budget_bytes"] == BUDGET


def dense_config() -> dict:
    """A dense, non-hybrid model shaped like Qwen3-8B: no layer_types, no linear attention."""
    return {
        "model_type": "qwen3",
        "torch_dtype": "bfloat16",
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": False,
    }


def test_non_hybrid_model_has_no_linear_state():
    config = dense_config()
    # KV: 2 x 36 layers x 8 KV heads x 128 x 2 bytes = 147,456 bytes/token.
    assert kv_bytes_per_token(config) == 147_456
    assert linear_state_bytes(config) == 0
    # Weights 16.4e9 (bf16); KV memory = 112,640,000,000 - 16,400,000,000 - 3,221,225,472 = 93,018,774,528;
    # largest = 93,018,774,528 / 147,456 = 630,824 -> capped at 40,960;
    # sequences at 40,960: 40,960 x 147,456 = 6,039,797,760 each -> 15.4 -> 15.
    r = fit_report(config, 16_400_000_000)
    assert r.linear_state_bytes == 0
    assert (r.full_attention_layers, r.linear_attention_layers) == (36, 0)
    assert r.largest_context == 40960
    assert r.seqs_at_max_model_len == 15
    # Parameters, per layer: q 4096x4096 + k, v 4096x1024 each + o 4096x4096 = 41,943,040, q/k norms 256,
    # MLP 3 x 4096 x 12288 = 150,994,944, norms 8,192: 192,946,432 x 36 = 6,946,071,552; + final norm 4096
    # + embedding and lm_head 2 x 151,936 x 4096 = 1,244,659,712 -> 8,190,735,360 (Qwen3-8B: "8.2B").
    params = param_counts(config)
    assert params.total == 8_190_735_360
    assert params.active == params.total - 151_936 * 4096 + 4096  # one embedding row per token
    # Unquantized: every weight read at 2 bytes.
    assert r.active_weight_bytes_per_token == 2 * params.active


def test_head_dim_falls_back_to_hidden_over_heads():
    config = dense_config()
    del config["head_dim"]
    # 4096 / 32 = 128: the same KV bytes.
    assert kv_bytes_per_token(config) == 147_456


def test_missing_keys_are_named():
    config = dense_config()
    del config["vocab_size"]
    with pytest.raises(ValueError, match="vocab_size"):
        fit_report(config, 1)


def test_the_simulated_hub_config_plans_the_same():
    # sim/hub/model.py writes the same config.json structure and values as the real checkpoint.
    from sim.hub.model import qwen35_moe_config

    assert fit_report(qwen35_moe_config(), WEIGHTS) == fit_report(qwen35_config(), WEIGHTS)


def gpt_oss_120b_config() -> dict:
    """openai/gpt-oss-120b's config.json keys the planner reads (its names: num_local_experts, sliding and full
    attention layers, MXFP4 experts with attention, router, embeddings and lm_head left in bf16)."""
    return {"model_type": "gpt_oss", "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36,
            "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 128,
            "num_experts_per_tok": 4, "experts_per_token": 4, "vocab_size": 201088,
            "max_position_embeddings": 131072, "sliding_window": 128, "attention_bias": True,
            "layer_types": ["sliding_attention", "full_attention"] * 18, "torch_dtype": "bfloat16",
            "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
                "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}}


def test_gpt_oss_120b_counts_its_local_experts_and_its_bf16_attention():
    """117 B parameters, 5.1 B active (OpenAI's model card); the experts in MXFP4 (4.25 bits), the rest bf16: ~63
    GB of weights, ~5 GB read per token (a roofline of ~55 tokens/s), and every layer's KV counted (a sliding
    layer keeps at most its window: the fit's safe side)."""
    from sparkfleet.model.config import config_problem, model_shape

    config = gpt_oss_120b_config()
    assert config_problem(config, "openai/gpt-oss-120b") is None and not model_shape(config).hybrid
    params = param_counts(config)
    assert 116e9 < params.total < 118e9 and 5.0e9 < params.active < 5.3e9
    report = fit_report(config, 65 * 10**9, max_model_len=131072)
    assert 60e9 < report.estimated_weights_bytes < 66e9
    assert 4.5e9 < report.active_weight_bytes_per_token < 5.5e9 and 45 < report.decode_tokens_per_s_at_0 < 62
    assert report.kv_bytes_per_token == 2 * 36 * 8 * 64 * 2 and report.fits
