"""What a model's config.json says about fitting and serving it.

When the hub cannot be asked at plan time, the recipe catalogue holds the
config.json facts of each catalogued model (`sparkfleet.contract.recipes.known_model`).
"""

from __future__ import annotations

from dataclasses import dataclass

# The config.json counts the planner reads: a positive integer where present (0 means "none" for the second
# group), at most INT32 (the layer count builds a list: at most MAX_LAYERS). A hub's NaN, Infinity, 0 heads or a
# negative size would crash the plan or make the fit too small.
POSITIVE = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
            "max_position_embeddings", "vocab_size", "intermediate_size", "moe_intermediate_size",
            "num_experts_per_tok", "linear_num_value_heads", "linear_num_key_heads", "linear_key_head_dim",
            "linear_value_head_dim", "linear_conv_kernel_dim", "experts_per_token")
NONE_OR_MORE = ("num_experts", "num_local_experts", "shared_expert_intermediate_size", "mtp_num_hidden_layers",
                "num_nextn_predict_layers")
SHAPE_KEYS = ("num_hidden_layers", "num_attention_heads", "hidden_size", "max_position_embeddings")
INT32 = 2**31 - 1
MAX_LAYERS = 100_000


def _count_problem(key: str, value, least: int) -> str | None:
    most = MAX_LAYERS if key.endswith("layers") else INT32
    if type(value) is int and least <= value <= most:
        return None
    kind = "a positive integer" if least else "an integer >= 0"
    return f"`{key}` = {repr(value)[:40]} is not {kind} (at most {most:,})"


def config_problem(config, repo: str) -> str | None:
    """Why a hub's config.json cannot be planned (one line naming the key and the repository), or None.

    Read before any arithmetic: the planner then never divides by a zero head count or converts a NaN.
    """
    where = f"config.json of {repo}"
    fix = "check model_repo and model_revision, or the hub it came from (hub_endpoint)"
    if not isinstance(config, dict):
        return f"{where} is not a JSON object: {fix}"
    text = config.get("text_config") or config  # as the fit reads it
    if not isinstance(text, dict):
        return f"{where}: `text_config` is not an object: {fix}"
    quant = config.get("quantization_config") or text.get("quantization_config") or {}
    if not isinstance(quant, dict):
        return f"{where}: `quantization_config` is not an object: {fix}"
    layer_types = text.get("layer_types")
    if layer_types is not None and not (isinstance(layer_types, list) and all(isinstance(x, str) for x in layer_types)):
        return f"{where}: `layer_types` is not a list of names: {fix}"
    missing = [key for key in SHAPE_KEYS if text.get(key) is None]
    if missing:
        return f"{where} lacks {', '.join(f'`{k}`' for k in missing)}: {fix}"
    checks = [(text, key, 1) for key in POSITIVE] + [(text, key, 0) for key in NONE_OR_MORE] + [(quant, "bits", 1)]
    for table, key, least in checks:
        problem = table.get(key) is not None and _count_problem(key, table[key], least)
        if problem:
            return f"{where}: {problem}: {fix}"
    return None


@dataclass(frozen=True)
class ModelShape:
    max_position_embeddings: int
    num_layers: int
    full_attention_layers: int
    num_kv_heads: int
    head_dim: int
    mtp_layers: int = 0  # multi-token-prediction layers shipped with the checkpoint (vLLM's "mtp" draft)

    @property
    def hybrid(self) -> bool:
        """Linear-attention (Gated DeltaNet / Mamba-style) layers beside full attention."""
        return self.full_attention_layers < self.num_layers


def mtp_layers(config: dict) -> int:
    """The checkpoint's MTP layers, as vLLM reads them for the "mtp" method (Qwen3.5: mtp_num_hidden_layers,
    DeepSeek-style: num_nextn_predict_layers); 0 when it has none."""
    text = config.get("text_config") or config
    return int(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers") or 0)


def model_shape(config: dict) -> ModelShape:
    """Read the text model's shape, whether nested under text_config or not."""
    text = config.get("text_config") or config
    layers = int(text["num_hidden_layers"])
    layer_types = text.get("layer_types") or ["full_attention"] * layers
    heads = int(text["num_attention_heads"])
    return ModelShape(
        max_position_embeddings=int(text["max_position_embeddings"]),
        num_layers=layers,
        full_attention_layers=sum(1 for t in layer_types if t in ("full_attention", "sliding_attention")),
        num_kv_heads=int(text.get("num_key_value_heads", heads)),
        head_dim=int(text.get("head_dim") or int(text["hidden_size"]) // heads),
        mtp_layers=mtp_layers(config),
    )
