"""What a model's config.json says about fitting and serving it.

When the hub cannot be asked at plan time, the recipe catalogue holds the
config.json facts of each catalogued model (`sparkfleet.model.recipes.known_model`).
"""

from __future__ import annotations

from dataclasses import dataclass


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
    text = config.get("text_config", config)
    return int(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers") or 0)


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
        mtp_layers=mtp_layers(config),
    )
