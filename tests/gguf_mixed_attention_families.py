"""Tiny mlx-lm families whose layers mix attention kinds, written as llama.cpp's converter
writes them: MiMo-V2-Flash and Step 3.5 (sliding and global layers of different sizes),
Kimi Linear (Kimi delta attention and latent attention), PLaMo 2 (Mamba and attention)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gguf
import numpy as np

from gguf_expert_families import llama3_rope_freqs
from gguf_models import ConvertedFamily, tiny_config

_SIGMOID = gguf.ExpertGatingFuncType.SIGMOID

# MiMo-V2-Flash: layer 1 global, the others sliding (window 4) with sinks and one KV head;
# values narrower than keys; a dense first layer. One multi-token-prediction block follows
# the decoder, as the converter counts it in the per-layer arrays.
_MIMO = tiny_config(
    "mimo_v2_flash",
    num_hidden_layers=4,
    hybrid_layer_pattern=[1, 0, 1, 1],
    moe_layer_freq=[0, 1, 1, 1],
    add_swa_attention_sink_bias=True,
    add_full_attention_sink_bias=False,
    sliding_window_size=4,
    swa_num_attention_heads=4,
    swa_num_key_value_heads=1,
    v_head_dim=8,
    swa_head_dim=16,
    swa_v_head_dim=8,
    partial_rotary_factor=0.5,
    rope_theta=1_000_000.0,
    swa_rope_theta=10000.0,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    n_shared_experts=None,
    routed_scaling_factor=None,
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    norm_topk_prob=True,
    n_group=1,
    topk_group=1,
    layernorm_epsilon=1e-5,
)
_MIMO_KEYS = {
    "block_count": 5,
    "nextn_predict_layers": 1,
    "head_count_kv": [1, 2, 1, 1, 1],
    "sliding_window": 4,
    "sliding_window_pattern": [True, False, True, True, True],
    "value_length": 8,
    "rope_dimension_count": 8,
    "rope_freq_base_swa": 10000.0,
    "layer_norm_rms_eps": 1e-5,
    "expert_count": 4,
    "expert_used_count": 2,
    "expert_feed_forward_length": 32,
    "expert_group_count": 1,
    "expert_group_used_count": 1,
    "expert_gating_func": _SIGMOID,
}

_STEP_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
# Step 3.5: global layers 0 and 3 (half-width RoPE, 4 heads over 2), sliding layers 1 and 2
# (8 heads over 4); clamped SwiGLU on some layers' experts and shared or dense MLPs.
_STEP = tiny_config(
    "step3p5",
    num_hidden_layers=4,
    num_attention_groups=2,
    layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
    sliding_window=4,
    partial_rotary_factors=[0.5, 1.0, 1.0, 0.5],
    attention_other_setting={"num_attention_heads": 8, "num_attention_groups": 4},
    rope_theta=[1_000_000.0, 10000.0, 10000.0, 1_000_000.0],
    rope_scaling=_STEP_LLAMA3_ROPE,
    yarn_only_types=["full_attention"],
    use_head_wise_attn_gate=True,
    moe_num_experts=4,
    moe_top_k=2,
    moe_intermediate_size=32,
    share_expert_dim=48,
    moe_layers_enum="1,2,3",
    moe_router_scaling_factor=3.0,
    norm_expert_weight=True,
    swiglu_limits=[0.0, 0.0, 0.5, 0.0],
    swiglu_limits_shared=[0.5, 0.0, 0.0, 0.5],
)
_STEP_KEYS = {
    "head_count": [4, 8, 8, 4],
    "head_count_kv": [2, 4, 4, 2],
    "sliding_window": 4,
    "sliding_window_pattern": [False, True, True, False],
    "rope_freq_base": 1_000_000.0,
    "rope_freq_base_swa": 10000.0,
    "layer_norm_rms_eps": 1e-5,
    "expert_count": 4,
    "expert_used_count": 2,
    "expert_feed_forward_length": 32,
    "expert_shared_feed_forward_length": 48,
    "expert_weights_scale": 3.0,
    "expert_weights_norm": True,
    "leading_dense_block_count": 1,
    "swiglu_clamp_exp": [0.0, 0.0, 0.5, 0.0],
    "swiglu_clamp_shexp": [0.5, 0.0, 0.0, 0.5],
}


def add_step3p5_rope_freqs(
    name: str, weight: np.ndarray, config: dict[str, Any]
) -> Iterator[tuple[str, np.ndarray]]:
    """The Llama 3 factors of the global layers' half-width RoPE, padded with ones to half
    a head, as the converter writes them."""
    yield name, weight
    if name == "model.norm.weight":
        dims = config["head_dim"] // 2
        text = {"rope_scaling": config["rope_scaling"], "head_dim": dims}
        factors = llama3_rope_freqs(text | {"rope_theta": config["rope_theta"][0]})
        yield "rope_freqs.weight", np.pad(factors, (0, dims // 2), constant_values=1.0)


# Kimi Linear: KDA layers 0, 1 and 3 (4 heads of 16), an MLA layer 2 (latent rank 32, 8
# RoPE-less "rope" features); a dense first layer, then experts with a shared one.
_KIMI = tiny_config(
    "kimi_linear",
    num_hidden_layers=4,
    num_key_value_heads=4,
    linear_attn_config={
        "kda_layers": [1, 2, 4],
        "full_attn_layers": [3],
        "num_heads": 4,
        "head_dim": 16,
        "short_conv_kernel_size": 4,
    },
    model_max_length=256,
    num_experts=4,
    num_experts_per_token=2,
    moe_intermediate_size=32,
    num_shared_experts=1,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    mla_use_nope=True,
    moe_router_activation_func="sigmoid",
    moe_renormalize=True,
    routed_scaling_factor=2.5,
    first_k_dense_replace=1,
)
_KIMI_KEYS = {
    "head_count_kv": [0, 0, 1, 0],
    "key_length": 32 + 8,
    "value_length": 32,
    "key_length_mla": 16 + 8,
    "value_length_mla": 16,
    "kv_lora_rank": 32,
    "rope_dimension_count": 8,
    "kda_head_dim": 16,
    "ssm_conv_kernel": 4,
    "layer_norm_rms_eps": 1e-5,
    "expert_count": 4,
    "expert_used_count": 2,
    "expert_feed_forward_length": 32,
    "expert_shared_count": 1,
    "leading_dense_block_count": 1,
    "expert_weights_scale": 2.5,
    "expert_gating_func": _SIGMOID,
}


def convert_kimi_linear(
    name: str, weight: np.ndarray, config: dict[str, Any]
) -> Iterator[tuple[str, np.ndarray]]:
    """The KDA convolutions as (1, channels, 1, width) and the decay as -exp(A_log)."""
    if name.endswith("_conv1d.weight"):
        channels, width, _ = weight.shape
        weight = weight.reshape(1, channels, 1, width)
    elif name.endswith(".A_log"):
        weight = -np.exp(weight)
    yield name, weight


# PLaMo 2: Mamba layers 0 and 2 (8 heads of 16), attention layers 1 and 3 (mamba_step 2).
_PLAMO2 = tiny_config(
    "plamo2",
    num_hidden_layers=4,
    hidden_size_per_head=16,
    mamba_d_state=16,
    mamba_d_conv=4,
    mamba_num_heads=8,
    mamba_step=2,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
_PLAMO2_KEYS = {
    "head_count": [0, 4, 0, 4],
    "head_count_kv": [0, 2, 0, 2],
    "layer_norm_rms_eps": 1e-6,
    "ssm_state_size": 16,
    "ssm_conv_kernel": 4,
    "ssm_time_step_rank": 8,
    "ssm_inner_size": 128,
    "ssm_group_count": 0,
}
# The offsets the converter adds to PLaMo 2's norm weights, by Hugging Face name ending.
_PLAMO2_NORM_OFFSETS = {
    ".pre_mixer_norm.weight": 1.0,
    ".post_mixer_norm.weight": 1.0 / 5,
    ".pre_mlp_norm.weight": 1.0,
    ".post_mlp_norm.weight": 1.0 / 5**1.5,
    "model.norm.weight": 1.0,
}


def convert_plamo2(
    name: str, weight: np.ndarray, config: dict[str, Any]
) -> Iterator[tuple[str, np.ndarray]]:
    """The decay as -exp(A_log), the kernel squeezed to (channels, width), the norms'
    offsets added."""
    if name.endswith(".A_log"):
        weight = -np.exp(weight)
    elif name.endswith(".conv1d.weight"):
        weight = weight.squeeze(-1)
    for ending, offset in _PLAMO2_NORM_OFFSETS.items():
        if name.endswith(ending):
            weight = weight + np.float32(offset)
    yield name, weight


MIXED_ATTENTION_FAMILIES = {
    "mimo_v2_flash": ConvertedFamily(
        "mimo2",
        _MIMO,
        _MIMO_KEYS,
        name_aliases=(
            ("switch_mlp", "experts"),
            ("e_score_correction_bias", "e_score_correction.bias"),
            ("attention_sink_bias", "attention_sink_bias.weight"),
        ),
    ),
    "step3p5": ConvertedFamily(
        "step35",
        _STEP,
        _STEP_KEYS,
        name_aliases=(
            ("mlp.switch_mlp.", "moe."),
            ("mlp.gate.gate.", "moe.gate."),
            ("mlp.gate.router_bias", "moe.router_bias.bias"),
            ("mlp.share_expert.", "share_expert."),
        ),
        split_tensor=add_step3p5_rope_freqs,
    ),
    # mlx-lm's embed_q / unembed_out are the converter's per-head split of kv_b_proj.
    "kimi_linear": ConvertedFamily(
        "kimi-linear",
        _KIMI,
        _KIMI_KEYS,
        name_aliases=(
            ("switch_mlp", "experts"),
            ("mlp.e_score_correction_bias", "mlp.gate.e_score_correction.bias"),
            ("_conv.conv.", "_conv1d."),
            ("self_attn.dt_bias", "self_attn.dt_proj.bias"),
            ("self_attn.embed_q", "self_attn.k_b_proj"),
            ("self_attn.unembed_out", "self_attn.v_b_proj"),
        ),
        split_tensor=convert_kimi_linear,
    ),
    "plamo2": ConvertedFamily(
        "plamo2",
        _PLAMO2,
        _PLAMO2_KEYS,
        name_aliases=(
            ("mixer.dt_bias", "mixer.dt_proj.bias"),
            ("_norm_weight", "_norm.weight"),
            ("mixer.q_weight", "mixer.q.weight"),
            ("mixer.k_weight", "mixer.k.weight"),
        ),
        split_tensor=convert_plamo2,
    ),
}
