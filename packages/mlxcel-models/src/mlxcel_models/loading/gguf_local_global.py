"""GGUF metadata of the sigmoid-routed expert families whose sliding-window and global
attention layers differ in head counts and RoPE (MiMo-V2-Flash, Step 3.5).

llama.cpp's converter writes which layers slide as `attention.sliding_window_pattern` (one
flag per block, multi-token-prediction blocks included), the per-layer head counts as
arrays, the sliding layers' RoPE base as `rope.freq_base_swa`, and leaves the expert layers
to show as their `ffn_gate_inp` routers; the mlx-lm families read a layer-type list, the
sliding layers' sizes under keys of their own, and the expert layers as a list.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_config import GGUFMetadata
from mlxcel_models.loading.gguf_hybrid import per_layer
from mlxcel_models.rope import FrequencyFactorRoPE

_SIGMOID_GATING = 2  # gguf.ExpertGatingFuncType.SIGMOID
# llama.cpp's RoPE base for sliding layers when the file has no `rope.freq_base_swa`.
_DEFAULT_SWA_ROPE_BASE = 10000.0


def sliding_layers(meta: GGUFMetadata, num_layers: int) -> list[bool]:
    """Which decoder layers use the sliding window, from `attention.sliding_window_pattern`.

    Raises:
        ModelLoadError: the pattern is missing or shorter than the decoder, or the layers are
            not a mix of sliding and global ones (both mlx-lm families look up one of each).
    """
    pattern = meta.required("attention.sliding_window_pattern")
    if not isinstance(pattern, list) or len(pattern) < num_layers:
        raise ModelLoadError(
            f"{meta.where}: {meta.architecture}.attention.sliding_window_pattern must hold a "
            f"flag for each of the {num_layers} layers, got {pattern!r}"
        )
    sliding = [bool(flag) for flag in pattern[:num_layers]]
    if all(sliding) or not any(sliding):
        raise ModelLoadError(
            f"{meta.where}: {meta.architecture} needs both sliding-window and global layers, "
            f"the pattern has {'only sliding' if all(sliding) else 'no sliding'} ones"
        )
    return sliding


def _sizes_by_kind(meta: GGUFMetadata, key: str, sliding: list[bool]) -> tuple[int, int]:
    """(global, sliding) value of a per-layer array, the same on every layer of a kind.

    Raises:
        ModelLoadError: two layers of one kind differ, or a layer has none.
    """
    values = per_layer(meta, key)[: len(sliding)]
    sizes = []
    for kind in (False, True):
        of_kind = {
            value for value, is_sliding in zip(values, sliding, strict=True) if is_sliding == kind
        }
        if len(of_kind) != 1 or min(of_kind) <= 0:
            raise ModelLoadError(
                f"{meta.where}: {meta.architecture}.{key} must be one positive value on every "
                f"{'sliding' if kind else 'global'} layer, got {sorted(of_kind)}"
            )
        sizes.append(of_kind.pop())
    return sizes[0], sizes[1]


def _expert_layers(meta: GGUFMetadata, num_layers: int) -> list[bool]:
    return [meta.has_tensor(f"blk.{i}.ffn_gate_inp.weight") for i in range(num_layers)]


def _check_no_rope_scaling(meta: GGUFMetadata, config: dict[str, Any]) -> None:
    """Refuse `rope.scaling.*`: mlx-lm's MiMo-V2-Flash rotates without scaling, and its
    Step 3.5 scales only the layers of `yarn_only_types`, which GGUF does not store."""
    scaling = config.get("rope_scaling")
    if scaling is not None:
        raise ModelLoadError(
            f"{meta.where}: {meta.architecture} with RoPE scaling ({scaling['rope_type']}) "
            "is not supported"
        )


def _check_sigmoid_router(meta: GGUFMetadata) -> None:
    gating = meta.get("expert_gating_func", _SIGMOID_GATING)
    if gating != _SIGMOID_GATING:
        raise ModelLoadError(
            f"{meta.where}: {meta.architecture}.expert_gating_func is {gating}; mlx-lm's "
            f"{meta.architecture} routes with a sigmoid ({_SIGMOID_GATING})"
        )


def mimo_v2_flash(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """MiMo-V2-Flash. The converter asserts that sliding and global layers share query heads
    and head sizes, so only their KV heads and RoPE bases differ. llama.cpp fixes what GGUF
    does not store: a sigmoid router whose top-k weights are normalized and not scaled, no
    shared experts, and the sinks' presence, which the `attn_sinks` tensors show.

    Raises:
        ModelLoadError: a layer pattern or per-layer KV heads mlx-lm cannot express, a
            router other than sigmoid, or RoPE scaling.
    """
    num_layers = config["num_hidden_layers"]
    sliding = sliding_layers(meta, num_layers)
    kv_heads, swa_kv_heads = _sizes_by_kind(meta, "attention.head_count_kv", sliding)
    _check_no_rope_scaling(meta, config)
    for heads in (kv_heads, swa_kv_heads):
        if config["num_attention_heads"] % heads:
            raise ModelLoadError(
                f"{meta.where}: {config['num_attention_heads']} query heads do not group "
                f"over {heads} KV heads"
            )
    _check_sigmoid_router(meta)
    window = config.get("sliding_window") or meta.size("attention.sliding_window")
    head_dim = config["head_dim"]
    value_dim = meta.size("attention.value_length", head_dim)
    sinks = [meta.has_tensor(f"blk.{i}.attn_sinks.weight") for i in range(num_layers)]
    return {
        "hybrid_layer_pattern": [int(flag) for flag in sliding],
        "moe_layer_freq": [int(flag) for flag in _expert_layers(meta, num_layers)],
        "add_full_attention_sink_bias": sinks[sliding.index(False)],
        "add_swa_attention_sink_bias": sinks[sliding.index(True)],
        "sliding_window_size": int(window),
        "num_key_value_heads": kv_heads,
        "swa_num_key_value_heads": swa_kv_heads,
        "swa_num_attention_heads": config["num_attention_heads"],
        "v_head_dim": value_dim,
        "swa_head_dim": head_dim,
        "swa_v_head_dim": value_dim,
        "swa_rope_theta": float(meta.get("rope.freq_base_swa", _DEFAULT_SWA_ROPE_BASE)),
        "partial_rotary_factor": config.get("partial_rotary_factor", 1.0),
        "layernorm_epsilon": config["rms_norm_eps"],
        "n_routed_experts": config.get("n_routed_experts"),
        "n_shared_experts": None,
        "routed_scaling_factor": None,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "n_group": meta.get("expert_group_count", 1),
        "topk_group": meta.get("expert_group_used_count", 1),
        "attention_value_scale": meta.get("attention.value_scale"),
    }


def step3p5(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """Step 3.5. llama.cpp fixes the partial RoPE GGUF does not store: global layers rotate
    half of `rope.dimension_count`, sliding ones all of `rope.dimension_count_swa` (else the
    same count); the expert layers show as their routers, and the SwiGLU clamps come as
    per-layer arrays (0: none), the shared one also clamping the dense layers.

    Raises:
        ModelLoadError: no expert layers, a router other than sigmoid, RoPE scaling other
            than Llama 3's factors, or a layer pattern or per-layer head counts mlx-lm
            cannot express.
    """
    num_layers = config["num_hidden_layers"]
    sliding = sliding_layers(meta, num_layers)
    heads, swa_heads = _sizes_by_kind(meta, "attention.head_count", sliding)
    kv_heads, swa_kv_heads = _sizes_by_kind(meta, "attention.head_count_kv", sliding)
    _check_no_rope_scaling(meta, config)
    _check_sigmoid_router(meta)
    experts = [i for i, is_expert in enumerate(_expert_layers(meta, num_layers)) if is_expert]
    if not experts:
        raise ModelLoadError(f"{meta.where}: step35 without expert layers (ffn_gate_inp)")
    head_dim = config["head_dim"]
    rotated = meta.size("rope.dimension_count", head_dim)
    swa_rotated = meta.size("rope.dimension_count_swa", rotated)
    base = float(meta.get("rope.freq_base", 10000.0))
    swa_base = float(meta.get("rope.freq_base_swa", _DEFAULT_SWA_ROPE_BASE))
    extras: dict[str, Any] = {
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
        "num_attention_heads": heads,
        "num_attention_groups": kv_heads,
        "attention_other_setting": {
            "num_attention_heads": swa_heads,
            "num_attention_groups": swa_kv_heads,
        },
        "partial_rotary_factors": [
            swa_rotated / head_dim if s else rotated / 2 / head_dim for s in sliding
        ],
        "rope_theta": [swa_base if s else base for s in sliding],
        "rope_scaling": None,
        "use_head_wise_attn_gate": meta.has_tensor("blk.0.attn_gate.weight"),
        "moe_layers_enum": ",".join(str(i) for i in experts),
        "moe_num_experts": config["num_experts"],
        "moe_top_k": config["num_experts_per_tok"],
        "share_expert_dim": meta.size("expert_shared_feed_forward_length"),
        "moe_router_scaling_factor": float(meta.get("expert_weights_scale", 0.0)) or 1.0,
        "norm_expert_weight": bool(meta.get("expert_weights_norm", False)),
    }
    for key, name in (
        ("swiglu_clamp_exp", "swiglu_limits"),
        ("swiglu_clamp_shexp", "swiglu_limits_shared"),
    ):
        if (limits := meta.get(key)) is not None:
            extras[name] = [float(limit) for limit in limits[:num_layers]]
    return extras


def install_step3p5_rope_factors(
    module: nn.Module, factors: mx.array, config: dict[str, Any]
) -> None:
    """Llama 3's `rope_freqs` on Step 3.5's global layers, as llama.cpp applies them; the
    converter pads the factors of their half-width RoPE with ones to half a head."""
    for layer, layer_type in zip(module.layers, config["layer_types"], strict=True):
        if layer_type == "sliding_attention":
            continue
        rope = layer.self_attn.rope
        layer.self_attn.rope = FrequencyFactorRoPE(rope.dims, rope.base, factors[: rope.dims // 2])
