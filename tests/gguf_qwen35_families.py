"""Tiny Qwen3.5 mlx-lm models (`qwen3_5`, `qwen3_5_moe`) written as llama.cpp's converter
writes them (`Qwen3_5TextModel`, `Qwen3_5MoeTextModel`): the gated-delta value heads
reordered from grouped per key head to tiled, Qwen3-Next's decay and convolution changes,
the MRoPE sections, and a multi-token-prediction layer after the decoder's.

Every tensor outside the prediction layer is what llama.cpp's own `convert_hf_to_gguf.py`
(llama-cpp-python 0.3.36's copy) writes for the same weights, checked tensor for tensor; the
converter also writes `attention.recurrent_layers`, which gguf 0.19's writer cannot."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gguf
import numpy as np

from gguf_models import ConvertedFamily, tiny_config
from gguf_recurrent_conversions import store_mamba_tensors

# Value rows of these tensors come after the queries' and keys' rows.
_AFTER_QUERIES_AND_KEYS = (".in_proj_qkv.", ".conv1d.")
_VALUE_HEAD_ROWS = (".in_proj_z.", ".in_proj_a.", ".in_proj_b.", ".A_log", ".dt_proj.bias")


def tile_value_heads(weight: np.ndarray, axis: int, key_heads: int, per_key: int) -> np.ndarray:
    """The converter's `_reorder_v_heads`: heads along `axis` from (key_heads, per_key)
    to (per_key, key_heads) order."""
    moved = np.moveaxis(weight, axis, 0)
    grouped = moved.reshape(key_heads, per_key, -1, *moved.shape[1:])
    tiled = grouped.swapaxes(0, 1).reshape(moved.shape)
    return np.ascontiguousarray(np.moveaxis(tiled, 0, axis))


def store_qwen3_5_tensors(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """A gated-delta layer's value heads tiled, then Qwen3-Next's changes (the decay for
    `A_log`, the convolution kernel squeezed); the last decoder layer also written again
    as the multi-token-prediction block, with its own norms and projection."""
    key_heads = config["linear_num_key_heads"]
    per_key = config["linear_num_value_heads"] // key_heads
    if ".linear_attn." in name and per_key > 1:
        if any(part in name for part in _AFTER_QUERIES_AND_KEYS):
            qk_rows = 2 * key_heads * config["linear_key_head_dim"]
            values = tile_value_heads(weight[qk_rows:], 0, key_heads, per_key)
            weight = np.concatenate([weight[:qk_rows], values])
        elif any(part in name for part in _VALUE_HEAD_ROWS):
            weight = tile_value_heads(weight, 0, key_heads, per_key)
        elif ".out_proj." in name:
            weight = tile_value_heads(weight, 1, key_heads, per_key)
    yield from store_mamba_tensors(name, weight, config)
    yield from _nextn_block(name, weight, config)


def _nextn_block(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    """The multi-token-prediction block (`mtp.*`), named as layer `num_hidden_layers`: an
    attention layer like the decoder's last (its copy here), `eh_proj` and its norms."""
    layers = config["num_hidden_layers"]
    last = f"model.layers.{layers - 1}."
    if name.startswith(last):
        arch = gguf.MODEL_ARCH.QWEN35MOE if config.get("num_experts") else gguf.MODEL_ARCH.QWEN35
        names = gguf.get_tensor_name_map(arch, layers + 1)
        mtp_name = names.get_name(name.replace(last, f"model.layers.{layers}."), (".weight",))
        yield mtp_name, weight
    if name == "model.norm.weight":
        hidden = config["hidden_size"]
        yield f"blk.{layers}.nextn.eh_proj.weight", np.zeros((hidden, 2 * hidden), np.float32)
        for norm in ("enorm", "hnorm", "shared_head_norm"):
            yield f"blk.{layers}.nextn.{norm}.weight", weight


# Full attention every second layer (not the default fourth), two value heads per key head,
# value heads of 32 (whole Q8_0/Q4_0 blocks, as real models' 128 are), a rotated quarter.
_ROPE = {
    "type": "default",
    "mrope_section": [2, 1, 1],
    "rope_theta": 1000000.0,
    "partial_rotary_factor": 0.25,
}
_LINEAR = {
    "num_hidden_layers": 4,
    "head_dim": 32,
    "rope_theta": 1000000.0,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "rope_parameters": _ROPE,
}
_KEYS = {
    "layer_norm_rms_eps": 1e-5,
    "block_count": 5,
    "nextn_predict_layers": 1,
    "rope_dimension_count": 8,
    "rope_dimension_sections": [2, 1, 1, 0],
    "ssm_conv_kernel": 4,
    "ssm_state_size": 32,
    "ssm_group_count": 2,
    "ssm_time_step_rank": 4,
    "ssm_inner_size": 128,
}
_NAMES = (
    ("language_model.", ""),
    ("switch_mlp", "experts"),
    ("linear_attn.dt_bias", "linear_attn.dt_proj.bias"),
)

QWEN35_FAMILIES = {
    "qwen3_5": ConvertedFamily(
        "qwen35",
        tiny_config("qwen3_5", **_LINEAR, full_attention_interval=2),
        _KEYS | {"full_attention_interval": 2},
        name_aliases=_NAMES,
        split_tensor=store_qwen3_5_tensors,
    ),
    "qwen3_5_moe": ConvertedFamily(
        "qwen35moe",
        tiny_config(
            "qwen3_5_moe",
            **_LINEAR,
            full_attention_interval=4,
            tie_word_embeddings=True,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            norm_topk_prob=True,
        ),
        _KEYS
        | {
            "full_attention_interval": 4,
            "expert_count": 4,
            "expert_used_count": 2,
            "expert_feed_forward_length": 32,
            "expert_shared_feed_forward_length": 64,
        },
        name_aliases=_NAMES,
        split_tensor=store_qwen3_5_tensors,
    ),
}
