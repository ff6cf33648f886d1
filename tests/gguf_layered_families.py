"""Tiny mlx-lm families whose layers differ in size, written as llama.cpp's converter
writes them: per-layer head counts and feed-forward widths as metadata arrays."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from gguf_models import VOCAB_SIZE, ConvertedFamily


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
}
