"""GGUF metadata of the families whose layers differ in size (OpenELM's per-layer head
counts and feed-forward widths, Nemotron-NAS's per-layer attention and MLP blocks), which
llama.cpp's converter writes as per-layer arrays under the usual `attention.head_count`,
`attention.head_count_kv` and `feed_forward_length` keys, where the mlx-lm families read
lists of their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.dimensions import check_head_counts, positive_int
from mlxcel_models.loading.gguf_config import GGUFMetadata, common_config
from mlxcel_models.loading.gguf_hybrid import per_layer
from mlxcel_models.loading.gguf_layouts import TensorJoin, unpermute_rope_rows
from mlxcel_models.rope import FrequencyFactorRoPE

_PER_LAYER_KEYS = ("attention.head_count", "attention.head_count_kv", "feed_forward_length")


def layered_base_config(meta: GGUFMetadata) -> dict[str, Any]:
    """`common_config` of the first layer's sizes, after checking each layer's heads group.

    Raises:
        ModelLoadError: as `common_config`, an array's length is not the layer count, or a
            layer's head counts are not positive or its query heads do not group over its KV
            heads.
    """
    heads = per_layer(meta, "attention.head_count")
    kv_heads = per_layer(meta, "attention.head_count_kv")
    for layer, (query, kv) in enumerate(zip(heads, kv_heads, strict=True)):
        names = (f"layer {layer}'s query heads", f"layer {layer}'s KV heads")
        for count, name in zip((query, kv), names, strict=True):
            positive_int(count, name, meta.where)
        check_head_counts(
            query,
            kv,
            names=names,
            where=meta.where,
        )
    metadata = dict(meta.metadata)
    for key in _PER_LAYER_KEYS:
        metadata[f"{meta.architecture}.{key}"] = per_layer(meta, key)[0]
    first = GGUFMetadata(metadata, meta.tensor_names, meta.architecture, where=meta.where)
    return common_config(first)


def openelm(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """OpenELM's lists. mlx-lm derives each layer's feed-forward width from a multiplier of
    the model width rounded to a divisor; the file stores the widths, which a divisor of 1
    and the width / model width multipliers give back exactly."""
    width = config["hidden_size"]
    return {
        "model_dim": width,
        "num_transformer_layers": config["num_hidden_layers"],
        "num_query_heads": per_layer(meta, "attention.head_count"),
        "num_kv_heads": per_layer(meta, "attention.head_count_kv"),
        "ffn_multipliers": [ffn / width for ffn in per_layer(meta, "feed_forward_length")],
        "ffn_dim_divisor": 1,
        "ffn_with_glu": True,
        "normalize_qk_projections": meta.has_tensor("blk.0.attn_q_norm.weight"),
        "share_input_output_layers": config["tie_word_embeddings"],
        "rope_freq_constant": config["rope_theta"],
    }


def _openelm_proj_1(
    tensors: Mapping[str, mx.array], config: Mapping[str, Any]
) -> dict[str, mx.array] | None:
    """OpenELM's fused feed-forward input (gate rows, then up rows), which the converter
    splits into `ffn_gate` and `ffn_up`."""
    if any(f"ffn_{part}.weight" not in tensors for part in ("gate", "up")):
        return None
    gate, up = tensors["ffn_gate.weight"], tensors["ffn_up.weight"]
    return {"ffn.proj_1.weight": mx.concatenate([gate, up])}


OPENELM_PROJ_1 = TensorJoin(
    frozenset({"ffn_gate.weight", "ffn_up.weight"}), _openelm_proj_1, "transformer.layers"
)


def _nas_ffn_width(ffn_mult: float, hidden: int) -> int:
    """Nemotron-NAS's MLP width for a multiplier, rounded up to a multiple of 256."""
    width = int(2 * ffn_mult * hidden / 3)
    return width if width % 256 == 0 else width + 256 - width % 256


def nemotron_nas(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """Nemotron-NAS's (DeciLM's) `block_configs` from the per-layer arrays.

    The converter writes an attention-free layer as 0 query and KV heads, a layer whose
    attention is one linear map as 0 KV heads, and an MLP-free layer as a width of 0; the
    other widths come from multipliers that mlx-lm turns back into the same width.

    Raises:
        ModelLoadError: a width that no multiplier gives (not a multiple of 256).
    """
    hidden = config["hidden_size"]
    blocks = []
    for layer, (heads, kv_heads, width) in enumerate(
        zip(
            per_layer(meta, "attention.head_count"),
            per_layer(meta, "attention.head_count_kv"),
            per_layer(meta, "feed_forward_length"),
            strict=True,
        )
    ):
        if heads == 0:
            attention = {"no_op": True}
        elif kv_heads == 0:
            attention = {"replace_with_linear": True}
        else:
            attention = {"n_heads_in_group": heads // kv_heads}
        if width == 0:
            ffn: dict[str, Any] = {"no_op": True}
        else:
            ffn = {"ffn_mult": round(1.5 * width / hidden, 6)}
            if _nas_ffn_width(ffn["ffn_mult"], hidden) != width:
                raise ModelLoadError(
                    f"{meta.where}: layer {layer}'s feed-forward width {width} is not one "
                    "Nemotron-NAS's multipliers give (a multiple of 256)"
                )
        blocks.append({"attention": attention, "ffn": ffn})
    return {"block_configs": blocks, "hidden_act": "silu"}


def unpermute_nas_rope_rows(
    base: str, arrays: dict[str, mx.array], config: dict[str, Any]
) -> dict[str, mx.array]:
    """Undo the converter's Q/K row permutation with each layer's own head count, which
    the rows give: the layers' KV heads differ."""
    if base not in ("attn_q", "attn_k"):
        return arrays
    return {
        key: unpermute_rope_rows(value, value.shape[0] // config["head_dim"])
        for key, value in arrays.items()
    }


def install_rope_factors_where_rotated(
    module: nn.Module, factors: mx.array, config: dict[str, Any]
) -> None:
    """Llama 3's `rope_freqs` on the layers whose attention rotates (not Nemotron-NAS's
    attention-free layers or those whose attention is one linear map)."""
    for layer in module.layers:
        if getattr(layer.self_attn, "rope", None) is not None:
            layer.self_attn.rope = FrequencyFactorRoPE(
                config["head_dim"], config["rope_theta"], factors
            )
