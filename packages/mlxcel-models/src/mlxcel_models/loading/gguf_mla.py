"""DeepSeek's multi-head latent attention (MLA) in GGUF files (`deepseek2`).

llama.cpp's converter writes DeepSeek V2/V3 as multi-query attention over the latent:
`head_count_kv` 1, `key_length` the latent rank plus the RoPE dimensions, the per-head sizes
under `key_length_mla` / `value_length_mla`. Its `kv_b_proj`, (heads * (nope + v), rank),
is split per head into `attn_k_b` (heads, rank, nope), transposed, and `attn_v_b`
(heads, v, rank); files from converters before that split hold `attn_kv_b` as it was.
mlx-lm's DeepSeek V2 wants `kv_b_proj` whole; its later latent-attention families (DeepSeek
V3, GLM-5's `glm_moe_dsa`, `mistral4`) want the split halves as `embed_q` and
`unembed_out`; `latent_attention_weights` gives either from either.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mlx.core as mx

from mlxcel_models.loading.gguf_config import GGUFMetadata
from mlxcel_models.loading.gguf_layouts import TensorJoin

_SIGMOID_GATING = 2  # gguf.ExpertGatingFuncType.SIGMOID: DeepSeek V3's router


def deepseek_model_type(metadata: Mapping[str, Any]) -> str:
    """`deepseek_v3` for a sigmoid-gated router (V3, R1, Kimi K2), else `deepseek_v2`."""
    gating = metadata.get("deepseek2.expert_gating_func")
    return "deepseek_v3" if gating == _SIGMOID_GATING else "deepseek_v2"


def deepseek_config(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """MLA sizes, the router and YaRN's attention scale from `deepseek2.*` keys."""
    rope_dims = meta.size("rope.dimension_count")
    rank = meta.size("attention.kv_lora_rank")
    # Files from converters before the MQA rewrite store the per-head sizes as
    # key_length / value_length and no *_mla keys.
    key_length = meta.size("attention.key_length_mla", meta.size("attention.key_length"))
    experts = meta.get("expert_count")
    shared = meta.get("expert_shared_count", 0)
    extras: dict[str, Any] = {
        "num_key_value_heads": config["num_attention_heads"],
        "kv_lora_rank": rank,
        "q_lora_rank": meta.get("attention.q_lora_rank"),
        "qk_rope_head_dim": rope_dims,
        "qk_nope_head_dim": key_length - rope_dims,
        "v_head_dim": meta.size("attention.value_length_mla", meta.size("attention.value_length")),
        "n_routed_experts": experts,
        "n_shared_experts": shared or None,
        "first_k_dense_replace": meta.get("leading_dense_block_count", 0),
        "routed_scaling_factor": float(meta.get("expert_weights_scale", 1.0)),
        "norm_topk_prob": bool(meta.get("expert_weights_norm", False)),
        "n_group": meta.get("expert_group_count", 1),
        "topk_group": meta.get("expert_group_used_count", 1),
        # llama.cpp ranks V2's softmax router over all experts, without its groups.
        "topk_method": "noaux_tc" if config["model_type"] == "deepseek_v3" else "greedy",
    }
    scaling = config.get("rope_scaling")
    if scaling is None and config["model_type"] == "deepseek_v2":
        # mlx-lm's DeepSeek V2 always builds its YaRN RoPE; factor 1 is plain RoPE.
        scaling = {"rope_type": "yarn", "type": "yarn", "factor": 1.0}
    if scaling is not None:
        # The converter stores 0.1 * mscale_all_dim; DeepSeek's mscale equals it.
        log_multiplier = float(meta.get("rope.scaling.yarn_log_multiplier", 0.0))
        mscale = log_multiplier / 0.1
        extras["rope_scaling"] = scaling | {"mscale": mscale, "mscale_all_dim": mscale}
    return extras


def latent_attention_weights(
    tensors: Mapping[str, mx.array], config: Mapping[str, Any]
) -> dict[str, mx.array] | None:
    """One layer's `self_attn` up-projection weights in mlx-lm's layout, once its GGUF
    tensors are all there.

    Args:
        tensors: the layer's GGUF tensors read so far, by name within the layer
            (`attn_kv_b.weight`, or `attn_k_b.weight` (heads, rank, nope) and
            `attn_v_b.weight` (heads, v, rank)), dense.
        config: the model's config (`model_type`, heads and MLA sizes).

    Returns:
        {"self_attn.kv_b_proj.weight"} (heads * (nope + v), rank) for `deepseek_v2`,
        {"self_attn.embed_q.weight", "self_attn.unembed_out.weight"} for the families
        that absorb it (`deepseek_v3`, `glm_moe_dsa`, `mistral4`); None while a half of
        the split pair is still to come.
    """
    heads = config["num_attention_heads"]
    nope = config["qk_nope_head_dim"]
    if "attn_kv_b.weight" in tensors:
        kv_b = tensors["attn_kv_b.weight"]
        per_head = kv_b.reshape(heads, -1, kv_b.shape[-1])
        k_b, v_b = per_head[:, :nope].swapaxes(1, 2), per_head[:, nope:]
    elif "attn_k_b.weight" in tensors and "attn_v_b.weight" in tensors:
        k_b, v_b = tensors["attn_k_b.weight"], tensors["attn_v_b.weight"]
    else:
        return None
    if config["model_type"] == "deepseek_v2":
        kv_b = mx.concatenate([k_b.swapaxes(1, 2), v_b], axis=1)
        return {"self_attn.kv_b_proj.weight": kv_b.reshape(-1, kv_b.shape[-1])}
    return {"self_attn.embed_q.weight": k_b, "self_attn.unembed_out.weight": v_b}


LATENT_ATTENTION = TensorJoin(
    frozenset({"attn_kv_b.weight", "attn_k_b.weight", "attn_v_b.weight"}),
    latent_attention_weights,
)
