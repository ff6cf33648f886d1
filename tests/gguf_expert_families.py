"""Tiny mixture-of-experts mlx-lm families whose experts llama.cpp's converter lays out
differently from mlx-lm, written as the converter writes them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gguf
import numpy as np

from gguf_models import VOCAB_SIZE, ConvertedFamily, tiny_config

_DBRX_EXPERTS = (("w1", "ffn_gate_exps"), ("v1", "ffn_up_exps"), ("w2", "ffn_down_exps"))


def stack_dbrx_experts(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each layer's experts stacked: gate (`w1`) and up (`v1`) as (experts, ffn, hidden),
    down (`w2`) as (experts, hidden, ffn), as the converter writes DBRX's `experts.mlp`."""
    merged = {name: weight for name, weight in weights.items() if ".ffn.experts." not in name}
    layers = sorted({int(name.split(".")[2]) for name in weights if ".ffn.experts." in name})
    for layer in layers:
        prefix = f"transformer.blocks.{layer}.ffn.experts"
        count = len({name for name in weights if name.startswith(f"{prefix}.")}) // 3
        for projection, gguf_name in _DBRX_EXPERTS:
            experts = [weights[f"{prefix}.{e}.{projection}.weight"] for e in range(count)]
            merged[f"blk.{layer}.{gguf_name}.weight"] = np.stack(experts)
    return merged


_LLAMA4_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
_LLAMA4_TEXT = {
    "model_type": "llama4_text",
    "attention_bias": False,
    "attention_chunk_size": 8192,
    "head_dim": 16,
    "hidden_size": 64,
    "interleave_moe_layer_step": 2,
    "intermediate_size": 32,
    "intermediate_size_mlp": 96,
    "max_position_embeddings": 256,
    "num_attention_heads": 4,
    "num_experts_per_tok": 1,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "num_local_experts": 4,
    "rms_norm_eps": 1e-5,
    "rope_scaling": _LLAMA4_SCALING,
    "rope_theta": 10000.0,
    "use_qk_norm": True,
    "vocab_size": VOCAB_SIZE,
}


def llama3_rope_freqs(text: dict[str, Any]) -> np.ndarray:
    """The `rope_freqs` factors the converter computes from Llama 3 RoPE scaling."""
    scaling, dims = text["rope_scaling"], text["head_dim"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context, factor = scaling["original_max_position_embeddings"], scaling["factor"]
    factors = []
    for freq in 1.0 / text["rope_theta"] ** (np.arange(0, dims, 2) / dims):
        wavelen = 2 * np.pi / freq
        smooth = (old_context / wavelen - low) / (high - low)
        if wavelen < old_context / high:
            factors.append(1.0)
        elif wavelen > old_context / low:
            factors.append(factor)
        else:
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, np.float32)


def add_llama4_rope_freqs(name: str, weight: np.ndarray, config: dict[str, Any]) -> Iterator:
    yield name, weight
    if name == "model.norm.weight":
        yield "rope_freqs.weight", llama3_rope_freqs(config["text_config"])


EXPERT_FAMILIES = {
    "dbrx": ConvertedFamily(
        "dbrx",
        tiny_config(
            "dbrx",
            d_model=64,
            n_layers=2,
            n_heads=4,
            intermediate_size=32,
            ffn_config={"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2},
            attn_config={"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000.0},
        ),
        {
            "layer_norm_eps": 1e-5,
            "clamp_kqv": 8.0,
            "expert_count": 4,
            "expert_used_count": 2,
        },
        merge_tensors=stack_dbrx_experts,
    ),
    # Llama 4 (Scout-like: QK norm, 16 experts or fewer), MoE every second layer, the
    # fourth layer global and without RoPE.
    "llama4": ConvertedFamily(
        "llama4",
        tiny_config("llama4", intermediate_size=96, num_hidden_layers=4, text_config=_LLAMA4_TEXT),
        {
            "layer_norm_rms_eps": 1e-5,
            "expert_count": 4,
            "expert_used_count": 1,
            "expert_feed_forward_length": 32,
            "interleave_moe_layer_step": 2,
            "rope_dimension_count": 16,
        },
        name_aliases=(("language_model.", ""),),
        split_tensor=add_llama4_rope_freqs,
    ),
    # AFMoE: layers 0-2 sliding with RoPE, layer 3 global without; one leading dense layer.
    "afmoe": ConvertedFamily(
        "afmoe",
        tiny_config(
            "afmoe",
            num_hidden_layers=4,
            layer_types=["sliding_attention"] * 3 + ["full_attention"],
            sliding_window=4,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            num_shared_experts=1,
            num_dense_layers=1,
            route_norm=True,
            route_scale=2.0,
            score_func="sigmoid",
            mup_enabled=True,
        ),
        {
            "layer_norm_rms_eps": 1e-5,
            "expert_count": 8,
            "expert_used_count": 2,
            "expert_feed_forward_length": 32,
            "expert_shared_count": 1,
            "leading_dense_block_count": 1,
            "expert_weights_norm": True,
            "expert_weights_scale": 2.0,
            "expert_gating_func": gguf.ExpertGatingFuncType.SIGMOID,
            "sliding_window": 4,
            "rope_dimension_count": 16,
        },
        name_aliases=(("mlp.expert_bias", "mlp.expert_bias.bias"),),
    ),
    # Ling 2.0: QK norm, half the head rotated, a sigmoid router over expert groups with the
    # expert bias, a leading dense layer and a shared expert of its own width.
    "bailing_moe2": ConvertedFamily(
        "bailingmoe2",
        tiny_config(
            "bailing_moe",
            num_hidden_layers=3,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            num_shared_experts=1,
            moe_shared_expert_intermediate_size=48,
            norm_topk_prob=True,
            first_k_dense_replace=1,
            use_qk_norm=True,
            partial_rotary_factor=0.5,
            moe_router_enable_expert_bias=True,
            routed_scaling_factor=2.5,
            score_function="sigmoid",
            n_group=4,
            topk_group=2,
        ),
        {
            "layer_norm_rms_eps": 1e-5,
            "expert_count": 8,
            "expert_used_count": 2,
            "expert_feed_forward_length": 32,
            "expert_shared_feed_forward_length": 48,
            "expert_shared_count": 1,
            "expert_weights_scale": 2.5,
            "expert_weights_norm": True,
            "leading_dense_block_count": 1,
            "rope_dimension_count": 8,
            "expert_group_count": 4,
            "expert_group_used_count": 2,
            "expert_gating_func": gguf.ExpertGatingFuncType.SIGMOID,
        },
        name_aliases=(
            ("switch_mlp", "experts"),
            ("gate.gate_proj", "gate"),
            ("gate.expert_bias", "gate.expert_bias.bias"),
        ),
    ),
}
