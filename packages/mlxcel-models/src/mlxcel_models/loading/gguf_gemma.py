"""Gemma 4 GGUF files as mlx-lm's `gemma4_text`; `GEMMA_ARCHITECTURES` also holds Gemma 3n
(`gguf_gemma3n`).

llama.cpp's converter (`Gemma4Model`, `conversion/gemma.py`) stores the norms as they are
(no `1 + w`), and writes the two layer kinds' sizes under separate keys: `key_length` is a
global layer's head size and `key_length_swa` a sliding one's; `head_count_kv` becomes a
per-layer array where the global layers have their own KV heads, `feed_forward_length`
one where the layers that share another's KV cache have double-wide MLPs. The global
layers' partial ("proportional") RoPE is written as a `rope_freqs` tensor whose factors
are 1 for the rotated frequencies and 1e30 for the rest, which llama.cpp's graph
(`src/models/gemma4.cpp`) applies to those layers only. The experts' router scale and
per-expert scale become `ffn_gate_inp.scale` and `ffn_down_exps.scale`, and their
gate and up projections stay fused (`ffn_gate_up_exps`, gate rows first).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_architecture import GGUFArchitecture
from mlxcel_models.loading.gguf_config import GGUFMetadata, common_config
from mlxcel_models.loading.gguf_gemma3n import (
    DEFAULT_SLIDING_ROPE_BASE,
    FULL,
    GEMMA3N,
    SLIDING,
    sliding_layers,
)
from mlxcel_models.loading.gguf_hybrid import per_layer
from mlxcel_models.rope import FrequencyFactorRoPE

# A layer's K/V tensors, which layers reading an earlier layer's cache do not use.
_KV_TENSORS = frozenset({"attn_k.weight", "attn_v.weight", "attn_k_norm.weight"})


def gemma4_base_config(meta: GGUFMetadata) -> dict[str, Any]:
    """`common_config` of a sliding layer: its head size (`key_length_swa`) and KV heads,
    and the first layer's feed-forward width.

    Raises:
        ModelLoadError: as `common_config`, or a per-layer array of the wrong length.
    """
    sliding = sliding_layers(meta)
    first = sliding.index(True) if any(sliding) else 0
    prefix = meta.architecture
    metadata = dict(meta.metadata)
    metadata[f"{prefix}.attention.head_count_kv"] = per_layer(meta, "attention.head_count_kv")[
        first
    ]
    metadata[f"{prefix}.feed_forward_length"] = per_layer(meta, "feed_forward_length")[0]
    metadata[f"{prefix}.attention.key_length"] = meta.size("attention.key_length_swa")
    # The rotated share of each layer kind is set in `gemma4`, not from the global count.
    metadata.pop(f"{prefix}.rope.dimension_count", None)
    return common_config(GGUFMetadata(metadata, meta.tensor_names, prefix, where=meta.where))


def gemma4(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """Gemma 4's layer kinds, head sizes, KV sharing, per-layer inputs and experts.

    Raises:
        ModelLoadError: the file has a shape mlx-lm's `gemma4_text` cannot hold (see the
            messages), or lacks a key llama.cpp requires.
    """
    num_layers = config["num_hidden_layers"]
    sliding = sliding_layers(meta)[:num_layers]
    global_head_dim = meta.size("attention.key_length")
    _check_equal(meta, "attention.value_length", global_head_dim)
    _check_equal(meta, "attention.value_length_swa", config["head_dim"])
    _check_equal(meta, "rope.dimension_count_swa", config["head_dim"])
    _check_equal(meta, "rope.dimension_count", global_head_dim)
    if not meta.has_tensor("rope_freqs.weight"):
        raise ModelLoadError(
            f"{meta.where} lacks rope_freqs.weight, the global layers' RoPE factors"
        )
    shared = int(meta.get("attention.shared_kv_layers", 0))
    kv_heads = per_layer(meta, "attention.head_count_kv")[:num_layers]
    global_kv = {
        heads for heads, is_sliding in zip(kv_heads, sliding, strict=True) if not is_sliding
    }
    keys_are_values = _keys_are_values(meta, sliding, num_layers - shared)
    if len(global_kv) > 1 or (global_kv - {config["num_key_value_heads"]} and not keys_are_values):
        raise ModelLoadError(
            f"{meta.where}: global layers with KV heads {sorted(global_kv)} besides the sliding "
            f"layers' {config['num_key_value_heads']}; mlx-lm's gemma4_text gives global layers "
            "their own count only where keys are values (no attn_v)"
        )
    return {
        "global_head_dim": global_head_dim,
        "num_global_key_value_heads": min(global_kv) if global_kv else None,
        "attention_k_eq_v": keys_are_values,
        "num_kv_shared_layers": shared,
        "use_double_wide_mlp": _double_wide(meta, config, num_layers - shared),
        "layer_types": [SLIDING if is_sliding else FULL for is_sliding in sliding],
        "sliding_window": meta.size("attention.sliding_window"),
        "hidden_size_per_layer_input": int(meta.get("embedding_length_per_layer_input", 0)),
        # llama.cpp sizes the per-layer embedding by the vocabulary.
        "vocab_size_per_layer_input": config["vocab_size"],
        "final_logit_softcapping": float(meta.get("final_logit_softcapping", 0.0)) or None,
        "partial_rotary_factor": 1.0,
        "rope_parameters": {
            FULL: {"rope_type": "default", "rope_theta": config["rope_theta"]},
            SLIDING: {
                "rope_type": "default",
                "rope_theta": float(meta.get("rope.freq_base_swa", DEFAULT_SLIDING_ROPE_BASE)),
            },
        },
    } | _experts(meta, config)


def _check_equal(meta: GGUFMetadata, key: str, expected: int) -> None:
    value = meta.get(key)
    if value is not None and int(value) != expected:
        raise ModelLoadError(
            f"{meta.where}: {meta.architecture}.{key} is {value}; mlx-lm's gemma4_text needs "
            f"{expected}"
        )


def _keys_are_values(meta: GGUFMetadata, sliding: list[bool], kv_layers: int) -> bool:
    """Whether the global layers use their keys as values (no `attn_v`: 26B, 31B)."""
    without_v = {
        not meta.has_tensor(f"blk.{layer}.attn_v.weight")
        for layer in range(kv_layers)
        if not sliding[layer]
    }
    if len(without_v) > 1:
        raise ModelLoadError(f"{meta.where}: only some global layers have attn_v")
    return without_v == {True}


def _double_wide(meta: GGUFMetadata, config: dict[str, Any], first_shared: int) -> bool:
    """Whether the layers that share an earlier layer's KV cache have MLPs twice as wide,
    the only per-layer widths mlx-lm's gemma4_text has."""
    widths = per_layer(meta, "feed_forward_length")[: config["num_hidden_layers"]]
    width = config["intermediate_size"]
    shared = set(widths[first_shared:])
    if set(widths[:first_shared]) != {width} or not shared <= {width} | {2 * width}:
        raise ModelLoadError(
            f"{meta.where}: feed-forward widths {widths}; mlx-lm's gemma4_text has one width, "
            "doubled on the layers that share a KV cache"
        )
    return shared == {2 * width}


def _experts(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    if not config.get("num_experts"):
        return {"enable_moe_block": False}
    layers = config["num_hidden_layers"]
    if not all(meta.has_tensor(f"blk.{layer}.ffn_gate_inp.weight") for layer in range(layers)):
        raise ModelLoadError(f"{meta.where}: only some layers have experts")
    return {
        "enable_moe_block": True,
        "top_k_experts": config["num_experts_per_tok"],
        "moe_intermediate_size": meta.size("expert_feed_forward_length"),
    }


def route_gemma4_tensor(name: str, config: dict[str, Any]) -> tuple[str, ...] | None:
    """The mlx-lm parameters of the Gemma 4 tensors gguf-py's table does not name: the
    experts (their fused gate/up rows split), the router's scales, and the unused K/V of
    layers that read an earlier layer's cache (left out, as mlx-lm's `sanitize` does)."""
    if not name.startswith("blk."):
        return None
    _, block, within = name.split(".", 2)
    layer = f"model.layers.{block}"
    first_shared = config["num_hidden_layers"] - config["num_kv_shared_layers"]
    if within in _KV_TENSORS and int(block) >= first_shared:
        return ()
    experts = f"{layer}.experts.switch_glu"
    routes = {
        "ffn_gate_up_exps.weight": (f"{experts}.gate_proj.weight", f"{experts}.up_proj.weight"),
        "ffn_gate_exps.weight": (f"{experts}.gate_proj.weight",),
        "ffn_up_exps.weight": (f"{experts}.up_proj.weight",),
        "ffn_down_exps.weight": (f"{experts}.down_proj.weight",),
        "ffn_gate_inp.scale": (f"{layer}.router.scale",),
        "ffn_down_exps.scale": (f"{layer}.router.per_expert_scale",),
    }
    return routes.get(within)


def install_global_rope_factors(
    module: nn.Module, factors: mx.array, config: dict[str, Any]
) -> None:
    """Give the global layers llama.cpp's RoPE: their `rope_freqs` factors over the global
    head size, which rotate by the full-width frequencies on the leading pairs only (what
    mlx-lm's `ProportionalRoPE` computes).

    Raises:
        ModelLoadError: the factors are not one per pair of the global head size.
    """
    head_dim = config["global_head_dim"]
    base = config["rope_parameters"][FULL]["rope_theta"]
    try:
        rope = FrequencyFactorRoPE(head_dim, base, factors)
    except ValueError as error:
        raise ModelLoadError(f"rope_freqs.weight: {error}") from error
    for layer in module.model.layers:
        if layer.layer_type == FULL:
            layer.self_attn.rope = rope


GEMMA_ARCHITECTURES = (
    GGUFArchitecture(
        "gemma4",
        "gemma4_text",
        base_config=gemma4_base_config,
        extras=gemma4,
        route_tensor=route_gemma4_tensor,
        install_rope_factors=install_global_rope_factors,
    ),
    GEMMA3N,
)
