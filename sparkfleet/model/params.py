"""A model's parameters from its config.json: total and per-token active counts (what the weights hold and
what one generated token reads), the bytes a parameter takes (quantized or in the model dtype), and the
weights of the checkpoint's MTP draft layers. Pure functions; model/fit.py builds the report from them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkfleet.model.config import mtp_layers
from sparkfleet.model.kv import head_dim, layer_counts, model_dtype_bytes, require, text_config


def quantized_bytes(config: dict) -> float | None:
    """Bytes per quantized weight (AWQ/GPTQ: `bits` / 8, 0.5 at 4 bits; group scales not counted), or None
    when the checkpoint is not quantized."""
    quant = config.get("quantization_config") or text_config(config).get("quantization_config") or {}
    method = str(quant.get("quant_method", "")).lower()
    if method == "fp8":
        return 1
    if method in ("awq", "gptq", "compressed-tensors") and quant.get("bits"):
        return int(quant["bits"]) / 8
    if method == "mxfp4":  # 4-bit values and one 8-bit scale per block of 32
        return 4.25 / 8
    return None


def weight_bytes_per_param(config: dict, weights_bytes: int, params: ParamCounts) -> tuple[float, float]:
    """(narrow, wide) bytes per parameter. A GGUF file (config from its header: a `gguf` key) mixes quant types
    tensor by tensor, so both are the files' bytes over the parameter count: the roofline reads that share of
    the active parameters."""
    if config.get("gguf") is not None and params.total:
        ratio = weights_bytes / params.total
        return ratio, ratio
    wide = model_dtype_bytes(config)
    return quantized_bytes(config) or wide, wide


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts of the text model (no vision tower, no MTP head).

    ``*_narrow`` are the weights a quantized checkpoint stores at 1 byte (the
    large matmuls: attention q/k/v/o, linear-attention in/out projections,
    expert, shared-expert and dense MLP projections); ``*_wide`` the rest,
    kept in the model dtype (embeddings, lm_head, routers, norms, conv and
    small gate projections). Unquantized: everything counts as wide.
    Block-FP8 scales (one per 128x128 block, < 0.03 %) are not counted.
    """

    total: int
    total_narrow: int
    active: int
    active_narrow: int

    @property
    def total_wide(self) -> int:
        return self.total - self.total_narrow

    @property
    def active_wide(self) -> int:
        return self.active - self.active_narrow


def _attn_output_gate(config: dict, text: dict) -> bool:
    """Qwen3-Next / Qwen3.5 attention: q_proj also emits a per-head output gate (2x its width)."""
    if "attn_output_gate" in text:
        return bool(text["attn_output_gate"])
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    return model_type.startswith(("qwen3_next", "qwen3_5"))


def _attention_quantized(config: dict) -> bool:
    """Whether a quantized checkpoint stores attention quantized too: not when its quantization_config leaves
    `self_attn` out (gpt-oss's MXFP4 quantizes the experts only and keeps attention in bf16)."""
    quant = config.get("quantization_config") or text_config(config).get("quantization_config") or {}
    skipped = quant.get("modules_to_not_convert") or []
    return not (isinstance(skipped, list) and any("self_attn" in str(m) for m in skipped))


def _attention_params(config: dict) -> tuple[int, int]:
    """(narrow, wide) parameters of one full-attention layer (all wide when the quantization leaves
    attention out)."""
    text = text_config(config)
    hidden = int(require(text, "hidden_size"))
    heads = int(require(text, "num_attention_heads"))
    kv_heads = int(text.get("num_key_value_heads") or heads)
    dim = head_dim(text)
    q_out = heads * dim * (2 if _attn_output_gate(config, text) else 1)
    kv_out = kv_heads * dim
    narrow = hidden * q_out + 2 * hidden * kv_out + heads * dim * hidden
    # Qwen3-family attention normalises q and k per head (q_norm, k_norm: head_dim each).
    wide = 2 * dim if str(text.get("model_type") or config.get("model_type") or "").startswith("qwen3") else 0
    if text.get("attention_bias"):
        wide += q_out + 2 * kv_out
    if not _attention_quantized(config):
        return 0, narrow + wide
    return narrow, wide


def _mlp_params(text: dict) -> tuple[int, int, int]:
    """(total narrow, active narrow, wide) parameters of one MLP: MoE or dense."""
    hidden = int(require(text, "hidden_size"))
    experts = int(text.get("num_experts") or text.get("num_local_experts") or 0)  # Mixtral, gpt-oss: local
    if not experts:
        dense = 3 * hidden * int(require(text, "intermediate_size"))
        return dense, dense, 0
    expert = 3 * hidden * int(text.get("moe_intermediate_size") or require(text, "intermediate_size"))
    shared_inter = int(text.get("shared_expert_intermediate_size") or 0)
    shared = 3 * hidden * shared_inter
    router = hidden * experts + (hidden if shared_inter else 0)  # + shared expert's sigmoid gate
    top_k = int(text.get("num_experts_per_tok") or require(text, "experts_per_token"))  # gpt-oss: the latter
    return experts * expert + shared, top_k * expert + shared, router


def draft_weight_bytes(config: dict) -> int:
    """Bytes of the checkpoint's MTP draft layers (what vLLM's "mtp" method loads from the same files).

    One MTP layer of Qwen3.5 (Qwen3-Next style): a projection of [embedding; hidden]
    (fc, 2 x hidden -> hidden), two pre-projection norms, one full-attention
    decoder layer with the model's MoE MLP, and a final norm; it shares the
    target's embedding and lm_head (mtp_use_dedicated_embeddings = false).
    Attention and expert matmuls are stored like the target's (FP8 when the
    checkpoint is), fc and norms in the model dtype. Qwen3.5-35B-A3B-FP8:
    attention 27,262,976 + experts/shared 808,452,096 = 835,715,072 FP8 bytes;
    fc 8,388,608 + router 524,288 + shared gate 2,048 + q/k norms 512 + norms
    5 x 2,048 = 8,925,696 bf16 parameters = 17,851,392 bytes; together
    853,566,464 bytes (0.79 GiB).
    """
    text = text_config(config)
    layers = mtp_layers(config)
    if not layers:
        return 0
    hidden = int(require(text, "hidden_size"))
    attn_narrow, attn_wide = _attention_params(config)
    mlp_narrow, _, mlp_wide = _mlp_params(text)
    narrow = attn_narrow + mlp_narrow
    wide = attn_wide + mlp_wide + 2 * hidden * hidden + 5 * hidden
    wide_bytes = model_dtype_bytes(config)
    return int(layers * (narrow * (quantized_bytes(config) or wide_bytes) + wide * wide_bytes))


def param_counts(config: dict) -> ParamCounts:
    """Total and per-token active parameters of the text model.

    What one generated token reads (the *active* count):

    - every attention and linear-attention layer in full (all tokens use them);
    - per MoE layer: the router (hidden x num_experts), ``num_experts_per_tok``
      routed experts and the shared expert (3 x hidden x intermediate each:
      gate, up, down) and the shared expert's sigmoid gate (hidden x 1);
      a dense model's MLP in full;
    - norms;
    - the lm_head in full (hidden x vocab: every logit is computed), but only
      ONE row of the input embedding (a lookup, hidden values).

    Totals count the whole embedding and every expert instead. Qwen3.5-35B-A3B
    (hidden 2048, vocab 248,320, 256 experts of 512, 8 active + 1 shared):

    - full attention (x10): q 2048x(16x256x2, gated) 16,777,216 + k, v
      2048x512 = 1,048,576 each + o 4096x2048 8,388,608 + q/k norms 512
      = 27,263,488
    - Gated DeltaNet (x30): in_proj_qkvz 2048x12,288 = 25,165,824 + in_proj_ba
      2048x64 = 131,072 + conv 8,192x4 = 32,768 + A_log, dt_bias 32 each +
      norm 128 + out_proj 4096x2048 = 8,388,608 = 33,718,464
    - MoE (x40): router 524,288; one expert 3x2048x512 = 3,145,728; shared
      gate 2,048; active: 524,288 + 9 x 3,145,728 + 2,048 = 28,837,888;
      total: 524,288 + 257 x 3,145,728 + 2,048 = 808,978,432
    - norms 2 x 2048 per layer + final 2048; lm_head = embedding =
      248,320 x 2048 = 508,559,360
    - active = 2,946,431,616 (2.95 B: "A3B"); total = 34,660,610,688
    """
    text = text_config(config)
    hidden = int(require(text, "hidden_size"))
    vocab = int(require(text, "vocab_size"))
    layers = int(require(text, "num_hidden_layers"))
    full, linear = layer_counts(text)
    other = layers - full - linear
    if other:
        raise ValueError(f"config.json has {other} layers neither full_attention, sliding_attention nor "
                         f"linear_attention")

    attn_narrow, attn_wide = _attention_params(config)

    # Linear attention (Gated DeltaNet).
    lin_narrow = lin_wide = 0
    if linear:
        v_heads = int(require(text, "linear_num_value_heads"))
        k_heads = int(require(text, "linear_num_key_heads"))
        key_dim = k_heads * int(require(text, "linear_key_head_dim"))
        v_dim = int(require(text, "linear_value_head_dim"))
        value_dim = v_heads * v_dim
        kernel = int(require(text, "linear_conv_kernel_dim"))
        lin_narrow = hidden * (2 * key_dim + 2 * value_dim) + value_dim * hidden  # in_proj_qkvz, out_proj
        lin_wide = (
            hidden * 2 * v_heads  # in_proj_ba
            + (2 * key_dim + value_dim) * kernel  # depthwise conv1d
            + 2 * v_heads  # A_log, dt_bias
            + v_dim  # gated RMSNorm
        )

    mlp_total_narrow, mlp_active_narrow, mlp_wide = _mlp_params(text)

    norms = 2 * hidden * layers + hidden
    per_layer_narrow = full * attn_narrow + linear * lin_narrow
    per_layer_wide = full * attn_wide + linear * lin_wide + layers * mlp_wide + norms
    lm_head = hidden * vocab
    embedding = 0 if text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)) else hidden * vocab

    total_narrow = per_layer_narrow + layers * mlp_total_narrow
    active_narrow = per_layer_narrow + layers * mlp_active_narrow
    total = total_narrow + per_layer_wide + lm_head + embedding
    active = active_narrow + per_layer_wide + lm_head + hidden  # one embedding row
    return ParamCounts(total=total, total_narrow=total_narrow, active=active, active_narrow=active_narrow)

