"""Tiny state-space and hybrid mlx-lm families written as llama.cpp's converter writes
them, with the converter's tensor rewrites for them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from gguf_models import VOCAB_SIZE, ConvertedFamily


def store_mamba_tensors(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """The decay `A = -exp(A_log)` in place of `A_log`, the convolution kernel squeezed to
    (channels, width)."""
    if name.endswith(".A_log"):
        weight = -np.exp(weight)
    elif name.endswith("conv1d.weight"):
        weight = weight.squeeze()
    yield name, np.ascontiguousarray(weight)


_MAMBA = {
    "model_type": "mamba",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "state_size": 16,
    "num_hidden_layers": 2,
    "conv_kernel": 4,
    "use_bias": False,
    "use_conv_bias": True,
    "time_step_rank": 4,
    "tie_word_embeddings": False,
}
_MAMBA_KEYS = {
    "context_length": 2**20,
    "feed_forward_length": 0,
    "head_count": 0,
    "ssm_conv_kernel": 4,
    "ssm_inner_size": 128,
    "ssm_state_size": 16,
    "ssm_time_step_rank": 4,
    "layer_norm_rms_eps": 1e-5,
}

RECURRENT_FAMILIES = {
    "mamba": ConvertedFamily(
        "mamba", _MAMBA, _MAMBA_KEYS | {"ssm_dt_b_c_rms": False}, split_tensor=store_mamba_tensors
    ),
    "falcon_mamba": ConvertedFamily(
        "mamba",
        _MAMBA | {"use_bcdt_rms": True, "tie_word_embeddings": True},
        _MAMBA_KEYS | {"ssm_dt_b_c_rms": True},
        split_tensor=store_mamba_tensors,
    ),
}
