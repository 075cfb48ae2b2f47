"""Generate a small, deterministic model repository shaped like Qwen3.5-35B-A3B-FP8.

The repository has the same file set and config structure as the real
checkpoint, but its safetensors shards hold only a few small tensors of
pseudo-random bytes, so the whole thing is a few MiB. Shards use the real
safetensors layout (8-byte little-endian header length, JSON header, data),
so anything that parses safetensors headers can read them.

Standard library only: the simulated hub imports this module and must run in
a minimal container with nothing but python3.
"""

from __future__ import annotations

import json
import math
import random
import struct
from pathlib import Path

__all__ = ["generate", "generate_repo", "generate_pooling_repo", "qwen35_moe_config", "qwen3_config",
           "DEFAULT_REPO_ID", "POOLING_REPOS"]

DEFAULT_REPO_ID = "Qwen/Qwen3.5-35B-A3B-FP8"
_MIB = 1024 * 1024
_DTYPE_SIZE = {"F8_E4M3": 1, "BF16": 2, "F32": 4}
_HIDDEN = 2048
_BLOCK = 128


def qwen35_moe_config() -> dict:
    """config.json with the structure of Qwen/Qwen3.5-35B-A3B-FP8."""
    layers = 40
    layer_types = [("full_attention" if (i + 1) % 4 == 0 else "linear_attention") for i in range(layers)]
    text_config = {
        "architectures": ["Qwen3_5MoeForCausalLM"],
        "model_type": "qwen3_5_moe_text",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 248044,
        "eos_token_id": 248046,
        "head_dim": 256,
        "hidden_act": "silu",
        "hidden_size": _HIDDEN,
        "initializer_range": 0.02,
        "layer_types": layer_types,
        "full_attention_interval": 4,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_value_head_dim": 128,
        "max_position_embeddings": 262144,
        "moe_intermediate_size": 512,
        "num_attention_heads": 16,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "num_hidden_layers": layers,
        "num_key_value_heads": 2,
        "output_router_logits": False,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "mrope_interleaved": True,
            "mrope_section": [11, 11, 10],
            "partial_rotary_factor": 0.25,
        },
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": 512,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "vocab_size": 248320,
        "mtp_num_hidden_layers": 1,  # the MTP layer vLLM's "mtp" speculative method drafts with
        "mtp_use_dedicated_embeddings": False,
    }
    vision_config = {
        "model_type": "qwen3_5_moe",
        "depth": 27,
        "hidden_size": 1152,
        "hidden_act": "gelu_pytorch_tanh",
        "intermediate_size": 4304,
        "num_heads": 16,
        "in_channels": 3,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": _HIDDEN,
        "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [],
        "initializer_range": 0.02,
    }
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "image_token_id": 248056,
        "video_token_id": 248057,
        "vision_start_token_id": 248053,
        "vision_end_token_id": 248054,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.57.0.dev0",
        "text_config": text_config,
        "vision_config": vision_config,
        "quantization_config": {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [_BLOCK, _BLOCK],
            "modules_to_not_convert": ["lm_head", "model.visual"],
        },
    }


def _generation_config() -> dict:
    return {
        "bos_token_id": 248044,
        "do_sample": True,
        "eos_token_id": [248046, 248044],
        "pad_token_id": 248044,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
        "transformers_version": "4.57.0.dev0",
    }


def _tokenizer() -> dict:
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    vocab = {chr(c): i for i, c in enumerate(range(32, 127))}
    added = [
        {"id": 248044 + i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, tok in enumerate(specials)
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "vocab": vocab, "merges": []},
    }


def _tokenizer_config() -> dict:
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "errors": "replace",
        "model_max_length": 262144,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


_CHAT_TEMPLATE = """{%- for message in messages %}
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\\n\\n</think>\\n\\n' }}
{%- endif %}
{%- endif %}
"""

_README = """---
license: apache-2.0
library_name: transformers
pipeline_tag: image-text-to-text
---

# Qwen3.5-35B-A3B-FP8 (simulated)

A small stand-in generated by sparkfleet's simulated hub. It has the file
layout and config.json structure of the real FP8 checkpoint (40 layers,
30 Gated DeltaNet + 10 full attention, 256 experts with 8 active), but its
safetensors shards hold a few tensors of pseudo-random bytes. It cannot
generate text.
"""


def _dump_json(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _random_bytes(seed: int, name: str, n: int) -> bytes:
    # String seeds are hashed with SHA-512 (seed version 2): stable across runs and platforms.
    return random.Random(f"sparkfleet-sim:{seed}:{name}").randbytes(n)


def _shard_tensors(layer: int, budget: int) -> list[tuple[str, str, list[int]]]:
    """(name, dtype, shape) for one shard holding expert 0 of one layer, sized to ~budget bytes."""
    prefix = f"model.language_model.layers.{layer}"
    norms = [
        (f"{prefix}.input_layernorm.weight", "BF16", [_HIDDEN]),
        (f"{prefix}.post_attention_layernorm.weight", "BF16", [_HIDDEN]),
    ]
    small = sum(_DTYPE_SIZE[d] * math.prod(s) for _, d, s in norms)
    # Three FP8 projections of shape [rows, 2048] plus their block scales take the rest.
    rows = max(1, (budget - small - 4096) // (3 * _HIDDEN))
    out: list[tuple[str, str, list[int]]] = []
    for proj in ("gate_proj", "up_proj", "down_proj"):
        name = f"{prefix}.mlp.experts.0.{proj}"
        shape = [_HIDDEN, rows] if proj == "down_proj" else [rows, _HIDDEN]  # [out_features, in_features]
        out.append((f"{name}.weight", "F8_E4M3", shape))
        out.append((f"{name}.weight_scale_inv", "BF16", [math.ceil(d / _BLOCK) for d in shape]))
    return out + norms


def _safetensors_bytes(tensors: list[tuple[str, str, list[int]]], seed: int) -> bytes:
    header: dict = {"__metadata__": {"format": "pt"}}
    chunks: list[bytes] = []
    offset = 0
    for name, dtype, shape in tensors:
        n = _DTYPE_SIZE[dtype] * math.prod(shape)
        if name.endswith("layernorm.weight"):
            data = b"\x80\x3f" * (n // 2)  # bf16 1.0, little endian
        else:
            data = _random_bytes(seed, name, n)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        chunks.append(data)
        offset += n
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)  # pad to 8-byte alignment, as the reference writer does
    return struct.pack("<Q", len(head)) + head + b"".join(chunks)


def generate_repo(dest: Path, *, shards: int = 4, shard_mb: float = 2.0, seed: int = 0) -> Path:
    """Write the repository into `dest` (created if needed) and return `dest`.

    Same arguments, same bytes. Each shard holds expert 0 of one layer (three
    FP8 E4M3 projections with BF16 block scales, two BF16 norms) and is about
    `shard_mb` MiB.
    """
    if shards < 1:
        raise ValueError("shards must be >= 1")
    if shard_mb <= 0:
        raise ValueError("shard_mb must be > 0")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)

    files: dict[str, bytes] = {
        "config.json": _dump_json(qwen35_moe_config()),
        "generation_config.json": _dump_json(_generation_config()),
        "tokenizer.json": _dump_json(_tokenizer()),
        "tokenizer_config.json": _dump_json(_tokenizer_config()),
        "chat_template.jinja": _CHAT_TEMPLATE.encode("utf-8"),
        "README.md": _README.encode("utf-8"),
    }

    budget = max(4096, int(shard_mb * _MIB) - 1024)  # leave room for the header
    weight_map: dict[str, str] = {}
    total_size = 0
    for i in range(shards):
        shard_name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensors = _shard_tensors(i, budget)
        files[shard_name] = _safetensors_bytes(tensors, seed)
        for name, dtype, shape in tensors:
            weight_map[name] = shard_name
            total_size += _DTYPE_SIZE[dtype] * math.prod(shape)
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    files["model.safetensors.index.json"] = _dump_json(index)

    for rel, data in files.items():
        path = dest / rel
        if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
            continue
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return dest


# The RAG services' models (recipes/qwen3-*-0.6b.toml): repo id -> max_position_embeddings of its config.json.
POOLING_REPOS = {"Qwen/Qwen3-Embedding-0.6B": 32768, "Qwen/Qwen3-Reranker-0.6B": 40960}
_QWEN3_HIDDEN = 1024


def qwen3_config(max_position_embeddings: int) -> dict:
    """config.json with the structure of the Qwen3-0.6B checkpoints the embedding and reranker models ship."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": _QWEN3_HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": 3072,
        "max_position_embeddings": max_position_embeddings,
        "max_window_layers": 28,
        "model_type": "qwen3",
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.3",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151669,
    }


def generate_pooling_repo(dest: Path, repo_id: str, *, shard_mb: float = 1.0, seed: int = 0) -> Path:
    """A small repository shaped like Qwen3-Embedding-0.6B / Qwen3-Reranker-0.6B: their config.json and one
    `model.safetensors` (as the real ones: no index) holding a slice of the embeddings and the norms in BF16."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    rows = max(1, (int(shard_mb * _MIB) - 16384) // (2 * _QWEN3_HIDDEN))
    tensors = [("model.embed_tokens.weight", "BF16", [rows, _QWEN3_HIDDEN]),
               ("model.layers.0.input_layernorm.weight", "BF16", [_QWEN3_HIDDEN]),
               ("model.layers.0.post_attention_layernorm.weight", "BF16", [_QWEN3_HIDDEN]),
               ("model.norm.weight", "BF16", [_QWEN3_HIDDEN])]
    name = repo_id.split("/")[-1]
    files = {
        "config.json": _dump_json(qwen3_config(POOLING_REPOS[repo_id])),
        "tokenizer.json": _dump_json(_tokenizer()),
        "tokenizer_config.json": _dump_json({**_tokenizer_config(), "model_max_length": POOLING_REPOS[repo_id]}),
        "README.md": f"---\nlicense: apache-2.0\n---\n\n# {name} (simulated)\n\nA small stand-in generated by "
                     f"sparkfleet's simulated hub: the config.json of the real checkpoint, a slice of its "
                     f"weights' shape.\n".encode(),
        "model.safetensors": _safetensors_bytes(tensors, seed),
    }
    for rel, data in files.items():
        path = dest / rel
        if not (path.is_file() and path.read_bytes() == data):
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
    return dest


def generate(repo_id: str, dest: Path, *, shards: int = 4, shard_mb: float = 2.0, seed: int = 0) -> Path:
    """The repository `repo_id` under dest: a RAG model's shape for POOLING_REPOS, else the chat model's."""
    if repo_id in POOLING_REPOS:
        return generate_pooling_repo(dest, repo_id, shard_mb=min(shard_mb, 1.0), seed=seed)
    return generate_repo(dest, shards=shards, shard_mb=shard_mb, seed=seed)
