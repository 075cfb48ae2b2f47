"""What a model's config.json says about fitting and serving it."""

from __future__ import annotations

from dataclasses import dataclass

# Used when the hub cannot be asked at plan time: the facts of the default
# model, from its published config.json (text_config of Qwen3.5-35B-A3B).
KNOWN_CONFIGS = {
    "Qwen/Qwen3.5-35B-A3B-FP8": {
        "model_type": "qwen3_5_moe",
        "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "qwen3_5_moe_text",
            "torch_dtype": "bfloat16",
            "num_hidden_layers": 40,
            "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 10,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "hidden_size": 2048,
            "max_position_embeddings": 262144,
            "num_experts": 256,
            "num_experts_per_tok": 8,
            "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512,
            "vocab_size": 248320,
            "tie_word_embeddings": False,
            "linear_num_value_heads": 32,
            "linear_num_key_heads": 16,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
        },
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
    }
}


@dataclass(frozen=True)
class ModelShape:
    max_position_embeddings: int
    num_layers: int
    full_attention_layers: int
    num_kv_heads: int
    head_dim: int

    @property
    def hybrid(self) -> bool:
        """Linear-attention (Gated DeltaNet / Mamba-style) layers beside full attention."""
        return self.full_attention_layers < self.num_layers


def model_shape(config: dict) -> ModelShape:
    """Read the text model's shape, whether nested under text_config or not."""
    text = config.get("text_config", config)
    layers = int(text["num_hidden_layers"])
    layer_types = text.get("layer_types") or ["full_attention"] * layers
    heads = int(text["num_attention_heads"])
    return ModelShape(
        max_position_embeddings=int(text["max_position_embeddings"]),
        num_layers=layers,
        full_attention_layers=sum(1 for t in layer_types if t == "full_attention"),
        num_kv_heads=int(text.get("num_key_value_heads", heads)),
        head_dim=int(text.get("head_dim") or int(text["hidden_size"]) // heads),
    )
