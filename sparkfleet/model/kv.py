"""What a sequence costs in memory, read from a model's config.json: the KV cache per token (full-attention
layers only, split over the GPUs of a tensor-parallel group) and one sequence's linear-attention state (Gated
DeltaNet: a fixed size whatever its length). The readers of config.json the fit and the parameter count share
live here too (`text_config`, `require`, `layer_counts`, `head_dim`, the dtypes). Pure functions; model/fit.py
builds the report from them.
"""

from __future__ import annotations

ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
_SSM_STATE_BYTES = 4  # vLLM keeps the Gated DeltaNet recurrent state in fp32


def text_config(config: dict) -> dict:
    """The text model's config: nested under text_config for multimodal checkpoints."""
    return config.get("text_config") or config


def require(text: dict, key: str):
    if text.get(key) is None:
        raise ValueError(f"config.json lacks {key!r}: cannot plan the fit")
    return text[key]


def model_dtype_bytes(config: dict) -> int:
    text = text_config(config)
    dtype = text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or config.get("dtype")
    return DTYPE_BYTES.get(str(dtype or "bfloat16").removeprefix("torch."), 2)


def layer_counts(text: dict) -> tuple[int, int]:
    """(full-attention layers, linear-attention layers). A sliding-window layer (gpt-oss) counts as full
    attention: it keeps at most its window of KV, so the fit is on the safe side."""
    layers = int(require(text, "num_hidden_layers"))
    types = text.get("layer_types") or ["full_attention"] * layers
    full = sum(1 for t in types if t in ATTENTION_LAYER_TYPES)
    linear = sum(1 for t in types if t == "linear_attention")
    return full, linear


def head_dim(text: dict) -> int:
    heads = int(require(text, "num_attention_heads"))
    return int(text.get("head_dim") or int(require(text, "hidden_size")) // heads)


def kv_dtype_bytes(config: dict, kv_cache_dtype: str) -> int:
    if kv_cache_dtype == "auto":
        return model_dtype_bytes(config)
    if kv_cache_dtype.startswith("fp8"):
        return 1
    if kv_cache_dtype in DTYPE_BYTES:
        return DTYPE_BYTES[kv_cache_dtype]
    raise ValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r} (auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2)")


def kv_heads_per_gpu(text: dict, tensor_parallel_size: int) -> int:
    """KV heads one GPU stores: vLLM splits them over the GPUs when there are at least as many heads as GPUs,
    and otherwise replicates one head on each GPU (max(1, heads // N))."""
    kv_heads = int(text.get("num_key_value_heads") or require(text, "num_attention_heads"))
    return max(1, kv_heads // tensor_parallel_size)


def kv_bytes_per_token(config: dict, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1) -> int:
    """KV cache bytes per token on one GPU: 2 (K and V) x full-attention layers x KV heads per GPU x head_dim x
    dtype bytes.

    Only full-attention layers store KV; linear-attention layers keep a fixed
    state instead (:func:`linear_state_bytes`). Qwen3.5-35B-A3B:
    2 x 10 x 2 x 256 x 2 = 20,480 bytes/token in bf16, 10,240 with fp8.
    Over N GPUs each stores num_key_value_heads / N heads when num_key_value_heads >= N,
    else one replicated head: Qwen3-235B-A22B (94 layers, 4 KV heads of 128)
    2 x 94 x 4 x 128 x 2 = 192,512 bytes/token on one GPU, 96,256 per GPU on 2,
    48,128 on 4, and still 48,128 on 8 (4 heads cannot be split 8 ways).
    """
    text = text_config(config)
    full, _ = layer_counts(text)
    kv_heads = kv_heads_per_gpu(text, tensor_parallel_size)
    return 2 * full * kv_heads * head_dim(text) * kv_dtype_bytes(config, kv_cache_dtype)


def draft_kv_bytes_per_token(config: dict, draft_layers: int, kv_cache_dtype: str = "auto",
                              tensor_parallel_size: int = 1) -> int:
    """KV cache bytes per token on one GPU of the MTP draft's layers (each a full-attention layer with its own
    KV cache, beside the target's): 2 x draft layers x KV heads per GPU x head_dim x dtype bytes."""
    text = text_config(config)
    return (draft_layers * 2 * kv_heads_per_gpu(text, tensor_parallel_size) * head_dim(text)
            * kv_dtype_bytes(config, kv_cache_dtype))


def linear_state_bytes(config: dict) -> int:
    """One sequence's linear-attention (Gated DeltaNet) state, in bytes; 0 without linear layers.

    Per linear-attention layer vLLM keeps two tensors per sequence:

    - the recurrent (SSM) state, fp32:
      linear_num_value_heads x linear_key_head_dim x linear_value_head_dim x 4
    - the causal-conv state, in the model dtype (bf16, 2 bytes):
      (linear_conv_kernel_dim - 1) x conv_dim x 2, where conv_dim is the
      width of the mixed q|k|v stream the depthwise conv runs over:
      linear_num_key_heads x linear_key_head_dim x 2 (q and k)
      + linear_num_value_heads x linear_value_head_dim (v)

    Qwen3.5-35B-A3B (30 linear layers, 32 value heads, 16 key heads, head
    dims 128, kernel 4):

    - recurrent: 32 x 128 x 128 x 4            = 2,097,152 bytes (2 MiB)
    - conv:      3 x (16x128x2 + 32x128) x 2
                 = 3 x 8,192 x 2                 =    49,152 bytes (48 KiB)
    - per layer                                  = 2,146,304 bytes
    - x 30 layers                                = 64,389,120 bytes = 61.4 MiB

    which is the reference's "~61 MiB per sequence". With prefix caching vLLM
    keeps more than one state per sequence ("doubled or more"): see
    ``linear_state_copies`` of :func:`fit_report`.
    """
    text = text_config(config)
    _, linear = layer_counts(text)
    if not linear:
        return 0
    v_heads = int(require(text, "linear_num_value_heads"))
    k_heads = int(require(text, "linear_num_key_heads"))
    k_dim = int(require(text, "linear_key_head_dim"))
    v_dim = int(require(text, "linear_value_head_dim"))
    kernel = int(require(text, "linear_conv_kernel_dim"))
    recurrent = v_heads * k_dim * v_dim * _SSM_STATE_BYTES
    conv_dim = k_heads * k_dim * 2 + v_heads * v_dim
    conv = (kernel - 1) * conv_dim * model_dtype_bytes(config)
    return linear * (recurrent + conv)

