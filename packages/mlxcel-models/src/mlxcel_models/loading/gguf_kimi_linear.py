"""Kimi Linear in GGUF files (`kimi-linear`): Kimi delta attention (KDA) layers between
multi-head latent attention (MLA) layers.

llama.cpp's converter tells the layers apart by `attention.head_count_kv`: 0 on a KDA
layer, 1 on an MLA layer (written, as for DeepSeek, as multi-query attention over the
latent). A KDA layer's three depthwise convolutions are stored as (1, channels, 1, width),
its decay as `A = -exp(A_log)` and its `dt_bias` as the bias of a time-step projection; an
MLA layer's `kv_b_proj` is split per head into `attn_k_b` (transposed) and `attn_v_b`,
which are mlx-lm's `embed_q` and `unembed_out` as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mlx.core as mx

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_config import GGUFMetadata
from mlxcel_models.loading.gguf_hybrid import attention_layers
from mlxcel_models.loading.gguf_layouts import TensorJoin
from mlxcel_models.loading.gguf_mla import LATENT_ATTENTION, latent_attention_weights

_SOFTMAX_GATING = 1  # gguf.ExpertGatingFuncType.SOFTMAX
# The tensors whose axes of size one the converter changed: the KDA convolutions, stored as
# (1, channels, 1, width) for mlx-lm's (channels, width, 1), and the decay and time-step bias
# in the checkpoint's shapes.
KDA_RESHAPED = frozenset({"ssm_conv1d_q", "ssm_conv1d_k", "ssm_conv1d_v", "ssm_a", "ssm_dt"})


def kimi_linear(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """Kimi Linear's layer kinds, KDA sizes, MLA sizes and router. The KDA layers have as
    many heads as the MLA layers (llama.cpp sizes both from `attention.head_count`); the
    MLA layers have no RoPE; the router's top-k weights are normalized (llama.cpp fixes
    both); the expert layers follow `leading_dense_block_count` dense ones.

    Raises:
        ModelLoadError: the layers are not a mix of both kinds, or the routers are not on
            every layer after the dense ones.
    """
    num_layers = config["num_hidden_layers"]
    latent = attention_layers(meta)[:num_layers]
    if all(latent) or not any(latent):
        raise ModelLoadError(
            f"{meta.where}: kimi-linear needs both KDA layers (head_count_kv 0) and MLA "
            f"layers, the file has {'only MLA' if all(latent) else 'only KDA'} ones"
        )
    dense = meta.get("leading_dense_block_count", 0)
    routers = [meta.has_tensor(f"blk.{i}.ffn_gate_inp.weight") for i in range(num_layers)]
    experts = meta.get("expert_count", 0)
    if routers != [bool(experts) and i >= dense for i in range(num_layers)]:
        raise ModelLoadError(
            f"{meta.where}: kimi-linear's expert layers must be all after the "
            f"{dense} leading dense ones"
        )
    rope_dims = meta.size("rope.dimension_count")
    key_length = meta.size("attention.key_length_mla")
    gating = meta.get("expert_gating_func")
    return {
        "linear_attn_config": {
            "kda_layers": [i + 1 for i, is_mla in enumerate(latent) if not is_mla],
            "full_attn_layers": [i + 1 for i, is_mla in enumerate(latent) if is_mla],
            "num_heads": config["num_attention_heads"],
            "head_dim": meta.size("kda.head_dim"),
            "short_conv_kernel_size": meta.size("ssm.conv_kernel"),
        },
        "num_key_value_heads": config["num_attention_heads"],
        "head_dim": key_length,
        "kv_lora_rank": meta.size("attention.kv_lora_rank"),
        "qk_rope_head_dim": rope_dims,
        "qk_nope_head_dim": key_length - rope_dims,
        "v_head_dim": meta.size("attention.value_length_mla"),
        "mla_use_nope": True,
        "model_max_length": config["max_position_embeddings"],
        "num_experts": experts,
        "moe_intermediate_size": config.get("moe_intermediate_size", config["intermediate_size"]),
        "num_experts_per_token": config.get("num_experts_per_tok", 1),
        "num_shared_experts": meta.get("expert_shared_count", 0),
        "moe_router_activation_func": "softmax" if gating == _SOFTMAX_GATING else "sigmoid",
        "moe_renormalize": True,
        "routed_scaling_factor": float(meta.get("expert_weights_scale", 0.0)) or 1.0,
        "first_k_dense_replace": dense,
        "moe_layer_freq": 1,
        "num_expert_group": meta.get("expert_group_count", 1),
        "topk_group": meta.get("expert_group_used_count", 1),
    }


def _kimi_latent_attention(
    tensors: Mapping[str, mx.array], config: Mapping[str, Any]
) -> dict[str, mx.array] | None:
    """An MLA layer's `embed_q` / `unembed_out`, laid out as DeepSeek V3's."""
    return latent_attention_weights(tensors, {**config, "model_type": "deepseek_v3"})


KIMI_LATENT_ATTENTION = TensorJoin(LATENT_ATTENTION.names, _kimi_latent_attention)
