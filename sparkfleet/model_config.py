"""What a model's config.json says about fitting and serving it."""

from __future__ import annotations

from dataclasses import dataclass

# Used when the hub cannot be asked at plan time: the facts of the default
# model, from its published config.json (text_config of Qwen3.5-35B-A3B).
KNOWN_CONFIGS = {
    "Qwen/Qwen3.5-35B-A3B-FP8": {
        "text_config": {
            "num_hidden_layers": 40,
            "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 10,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "max_position_embeddings": 262144,
        }
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
