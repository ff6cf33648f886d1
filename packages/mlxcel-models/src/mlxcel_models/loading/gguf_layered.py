"""GGUF metadata of the families whose layers differ in size (OpenELM's per-layer head
counts and feed-forward widths), which llama.cpp's converter writes as per-layer arrays
under the usual `attention.head_count`, `attention.head_count_kv` and
`feed_forward_length` keys, where the mlx-lm families read lists of their own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mlx.core as mx

from mlxcel_models.loading.dimensions import check_head_counts, positive_int
from mlxcel_models.loading.gguf_config import GGUFMetadata, common_config
from mlxcel_models.loading.gguf_hybrid import per_layer
from mlxcel_models.loading.gguf_layouts import TensorJoin

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
