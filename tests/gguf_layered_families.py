"""Tiny mlx-lm families whose layers differ in size, written as llama.cpp's converter
writes them: per-layer head counts and feed-forward widths as metadata arrays."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from factories import llama_cpp_permute
from gguf_expert_families import llama3_rope_freqs
from gguf_models import VOCAB_SIZE, ConvertedFamily, tiny_config


def split_openelm_proj_1(
    name: str, weight: np.ndarray, config: dict[str, Any]
) -> Iterator[tuple[str, np.ndarray]]:
    """OpenELM's fused `ffn.proj_1` written as ffn_gate (first half) and ffn_up."""
    match = re.fullmatch(r"transformer\.layers\.(\d+)\.ffn\.proj_1\.weight", name)
    if match is None:
        yield name, weight
        return
    gate, up = np.split(weight, 2)
    yield f"blk.{match[1]}.ffn_gate.weight", gate
    yield f"blk.{match[1]}.ffn_up.weight", up


def permute_nas_rows(
    name: str, weight: np.ndarray, config: dict[str, Any]
) -> Iterator[tuple[str, np.ndarray]]:
    """Nemotron-NAS's Q/K rows permuted with each layer's own head count, and the Llama 3
    RoPE factors as `rope_freqs`."""
    if name.endswith(("q_proj.weight", "k_proj.weight")):
        weight = llama_cpp_permute(weight, weight.shape[0] // config["head_dim"])
    yield name, weight
    if name == "model.norm.weight":
        yield "rope_freqs.weight", llama3_rope_freqs(config)


# The offsets the converter adds to PLaMo 3's norm weights, by Hugging Face name ending.
_PLAMO3_NORM_OFFSETS = {
    ".pre_mixer_norm.weight": 1.0,
    ".post_mixer_norm.weight": 1.0 / 5,
    ".pre_mlp_norm.weight": 1.0,
    ".post_mlp_norm.weight": 1.0 / 5**1.5,
    ".mixer.q_norm.weight": 1.0,
    ".mixer.k_norm.weight": 1.0,
    "model.norm.weight": 1.0,
}


def offset_plamo3_norms(
    name: str, weight: np.ndarray, config: dict[str, Any]
) -> Iterator[tuple[str, np.ndarray]]:
    for ending, offset in _PLAMO3_NORM_OFFSETS.items():
        if name.endswith(ending):
            weight = weight + np.float32(offset)
            break
    yield name, weight


_OPENELM = {
    "model_type": "openelm",
    "head_dim": 16,
    "num_transformer_layers": 3,
    "model_dim": 64,
    "vocab_size": VOCAB_SIZE,
    "ffn_dim_divisor": 8,
    "num_query_heads": [4, 4, 8],
    "num_kv_heads": [2, 1, 2],
    "ffn_multipliers": [0.5, 1.0, 1.5],
    "rope_freq_constant": 10000.0,
    # Read by the test writer only.
    "num_hidden_layers": 3,
    "hidden_size": 64,
}

# Layers: grouped attention, attention as one linear map, no attention, no MLP.
_NAS_BLOCKS = [
    {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 6.0}},
    {"attention": {"replace_with_linear": True}, "ffn": {"ffn_mult": 12.0}},
    {"attention": {"no_op": True}, "ffn": {"ffn_mult": 6.0}},
    {"attention": {"n_heads_in_group": 4}, "ffn": {"no_op": True}},
]
_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

LAYERED_FAMILIES = {
    "openelm": ConvertedFamily(
        "openelm",
        _OPENELM,
        {
            "head_count": [4, 4, 8],
            "head_count_kv": [2, 1, 2],
            "feed_forward_length": [32, 64, 96],
            "key_length": 16,
            "value_length": 16,
            "rope_dimension_count": 16,
            "rope_freq_base": 10000.0,
            "layer_norm_rms_eps": 1e-6,
        },
        split_tensor=split_openelm_proj_1,
    ),
    # PLaMo 3: layers 0 and 2 local (window 4, RoPE base 5000), layers 1 and 3 global.
    "plamo3": ConvertedFamily(
        "plamo3",
        tiny_config(
            "plamo3",
            num_hidden_layers=4,
            sliding_window=4,
            sliding_window_pattern=2,
            rope_theta=1_000_000.0,
            rope_local_theta=5000.0,
            tie_word_embeddings=True,
        ),
        {
            "layer_norm_rms_eps": 1e-5,
            "sliding_window": 4,
            "sliding_window_pattern": 2,
            "rope_freq_base": 1_000_000.0,
            "rope_freq_base_swa": 5000.0,
        },
        split_tensor=offset_plamo3_norms,
    ),
    "nemotron-nas": ConvertedFamily(
        "deci",
        tiny_config(
            "nemotron-nas",
            num_hidden_layers=4,
            block_configs=_NAS_BLOCKS,
            hidden_act="silu",
            rope_scaling=_LLAMA3_ROPE,
        ),
        {
            "head_count": [4, 4, 0, 4],
            "head_count_kv": [2, 0, 0, 1],
            "feed_forward_length": [256, 512, 256, 0],
            "rope_dimension_count": 16,
            "layer_norm_rms_eps": 1e-5,
        },
        name_aliases=(("self_attn.linear.", "self_attn.linear_attn."),),
        split_tensor=permute_nas_rows,
    ),
}
