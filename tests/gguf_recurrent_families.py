"""Tiny state-space and hybrid mlx-lm families written as llama.cpp's converter writes
them; the converter's tensor rewrites for them are in `gguf_recurrent_conversions`."""

from __future__ import annotations

import gguf

from gguf_models import VOCAB_SIZE, ConvertedFamily, tiny_config
from gguf_recurrent_conversions import (
    RWKV7_NAMES,
    convert_rwkv7,
    split_in_proj_qkvz,
    squeeze_short_conv,
    stack_rwkv7_mixes,
    store_granite_hybrid_tensors,
    store_mamba2_tensors,
    store_mamba_tensors,
    store_nemotron_h_moe_tensors,
)

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

_MAMBA2 = {
    "model_type": "mamba2",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 8,
    "head_dim": 16,
    "state_size": 16,
    "num_hidden_layers": 2,
    "layer_norm_epsilon": 1e-5,
    "conv_kernel": 4,
    "n_groups": 2,
    "use_bias": False,
    "use_conv_bias": True,
    "tie_word_embeddings": False,
    "time_step_limit": (0.0, float("inf")),
    "time_step_rank": 8,
}
_MAMBA2_KEYS = _MAMBA_KEYS | {"ssm_time_step_rank": 8, "ssm_group_count": 2}

# Falcon-H1's multipliers are folded into the weights by the converter, as by mlx-lm's
# sanitize: the tiny model's weights stand for the folded ones, its multipliers all 1.
_FALCON_H1 = tiny_config(
    "falcon_h1",
    head_dim=16,
    mamba_d_ssm=128,
    mamba_n_heads=8,
    mamba_d_head=16,
    mamba_d_state=16,
    mamba_d_conv=4,
    mamba_n_groups=2,
    mamba_rms_norm=True,
    mamba_norm_before_gate=False,
    attention_in_multiplier=1.0,
    attention_out_multiplier=1.0,
    embedding_multiplier=1.0,
    key_multiplier=1.0,
    lm_head_multiplier=1.0,
    ssm_in_multiplier=1.0,
    ssm_out_multiplier=1.0,
    mlp_multipliers=[1.0, 1.0],
    ssm_multipliers=[1.0] * 5,
)

_JAMBA = tiny_config(
    "jamba",
    num_hidden_layers=4,
    attn_layer_offset=1,
    attn_layer_period=2,
    expert_layer_offset=1,
    expert_layer_period=2,
    mamba_d_conv=4,
    mamba_d_state=16,
    mamba_expand=2,
    mamba_dt_rank=4,
    num_experts=4,
    num_experts_per_tok=2,
)
# What the converter writes: KV heads only on attention layers.
_JAMBA_KEYS = {
    "layer_norm_rms_eps": 1e-5,
    "head_count_kv": [0, 2, 0, 2],
    "ssm_conv_kernel": 4,
    "ssm_inner_size": 128,
    "ssm_state_size": 16,
    "ssm_time_step_rank": 4,
    "expert_count": 4,
    "expert_used_count": 2,
}

# Nemotron-H: Mamba 2, attention and MLP blocks; per-layer KV heads and MLP sizes.
_NEMOTRON_H = tiny_config(
    "nemotron_h",
    hybrid_override_pattern=["M", "*", "-", "M", "-"],
    num_hidden_layers=5,
    mamba_num_heads=8,
    mamba_head_dim=16,
    mamba_proj_bias=False,
    ssm_state_size=16,
    conv_kernel=4,
    n_groups=2,
    attention_bias=False,
    mlp_bias=False,
    layer_norm_epsilon=1e-5,
    use_bias=False,
    use_conv_bias=True,
)
_NEMOTRON_H_KEYS = {
    "layer_norm_rms_eps": 1e-5,
    "head_count_kv": [0, 2, 0, 0, 0],
    "feed_forward_length": [0, 0, 96, 0, 96],
    "ssm_conv_kernel": 4,
    "ssm_inner_size": 128,
    "ssm_state_size": 16,
    "ssm_time_step_rank": 8,
    "ssm_group_count": 2,
}

_GRANITE_HYBRID = tiny_config(
    "granitemoehybrid",
    num_hidden_layers=4,
    layer_types=["mamba", "attention", "mamba", "mamba"],
    attention_bias=False,
    embedding_multiplier=3.0,
    attention_multiplier=0.2,
    logits_scaling=2.0,
    residual_multiplier=0.5,
    mamba_n_heads=8,
    mamba_d_head=16,
    mamba_proj_bias=False,
    mamba_d_state=16,
    mamba_d_conv=4,
    mamba_n_groups=1,
    mamba_conv_bias=True,
    position_embedding_type="nope",
    time_step_limit=(0.0, float("inf")),
)
_GRANITE_HYBRID_KEYS = {
    "layer_norm_rms_eps": 1e-5,
    "head_count_kv": [0, 2, 0, 0],
    "rope_scaling_finetuned": False,
    "logit_scale": 2.0,
    "attention_scale": 0.2,
    "embedding_scale": 3.0,
    "residual_scale": 0.5,
    "ssm_conv_kernel": 4,
    "ssm_inner_size": 128,
    "ssm_state_size": 16,
    "ssm_time_step_rank": 8,
    "ssm_group_count": 1,
}
_GRANITE_HYBRID_NAMES = (
    ("block_sparse_moe.switch_mlp", "mlp.experts"),
    ("mamba.dt_bias", "mamba.dt_proj.bias"),
)

_LFM2 = tiny_config(
    "lfm2",
    num_hidden_layers=4,
    num_key_value_heads=2,
    layer_types=["conv", "full_attention", "conv", "conv"],
    norm_eps=1e-5,
    conv_bias=False,
    conv_L_cache=3,
    block_dim=64,
    # Adjusted to 96, the feed-forward length the converter writes.
    block_ff_dim=144,
    block_multiple_of=32,
    block_ffn_dim_multiplier=1.0,
    block_auto_adjust_ff_dim=True,
    tie_word_embeddings=True,
)

# Qwen3-Next: gated-delta layers, then full attention every fourth layer; experts with a
# shared expert. Two value heads per key head.
_QWEN3_NEXT = tiny_config(
    "qwen3_next",
    num_hidden_layers=4,
    linear_num_value_heads=4,
    linear_num_key_heads=2,
    linear_key_head_dim=16,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
    num_experts=4,
    num_experts_per_tok=2,
    decoder_sparse_step=1,
    shared_expert_intermediate_size=64,
    mlp_only_layers=[],
    moe_intermediate_size=32,
    partial_rotary_factor=0.25,
    norm_topk_prob=True,
    full_attention_interval=4,
)
_QWEN3_NEXT_KEYS = {
    "layer_norm_rms_eps": 1e-5,
    "rope_dimension_count": 4,
    "expert_count": 4,
    "expert_used_count": 2,
    "expert_feed_forward_length": 32,
    "expert_shared_feed_forward_length": 64,
    "ssm_conv_kernel": 4,
    "ssm_state_size": 16,
    "ssm_group_count": 2,
    "ssm_time_step_rank": 4,
    "ssm_inner_size": 32,
    "full_attention_interval": 4,
}

_RWKV7 = {
    "model_type": "rwkv7",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 96,
    "norm_eps": 1e-5,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "a_low_rank_dim": 8,
    "v_low_rank_dim": 8,
    "gate_low_rank_dim": 16,
    "decay_low_rank_dim": 8,
    "tie_word_embeddings": False,
}
_RWKV7_KEYS = {
    "context_length": 1048576,
    "feed_forward_length": 96,
    "head_count": 0,
    "layer_norm_eps": 1e-5,
    "wkv_head_size": 16,
    "decay_lora_rank": 8,
    "iclr_lora_rank": 8,
    "value_residual_mix_lora_rank": 8,
    "gate_lora_rank": 16,
}

_LFM2_MOE = tiny_config(
    "lfm2_moe",
    num_hidden_layers=4,
    layer_types=["conv", "full_attention", "conv", "conv"],
    norm_eps=1e-5,
    conv_bias=False,
    conv_L_cache=3,
    moe_intermediate_size=32,
    num_experts=4,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    use_expert_bias=True,
    num_dense_layers=1,
    routed_scaling_factor=1.0,
    tie_word_embeddings=True,
)

# Nemotron 3-style MoE: experts on a latent, a shared expert, sigmoid routing with a bias.
_NEMOTRON_H_MOE = _NEMOTRON_H | {
    "hybrid_override_pattern": ["M", "*", "E", "M", "E"],
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 48,
    "n_shared_experts": 1,
    "moe_latent_size": 32,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "n_group": 1,
    "topk_group": 1,
}
_NEMOTRON_H_MOE_KEYS = _NEMOTRON_H_KEYS | {
    "feed_forward_length": [0, 0, 32, 0, 32],
    "expert_count": 4,
    "expert_used_count": 2,
    "expert_feed_forward_length": 32,
    "expert_shared_feed_forward_length": 48,
    "expert_shared_count": 1,
    "expert_weights_norm": True,
    "expert_weights_scale": 2.5,
    "expert_group_count": 1,
    "moe_latent_size": 32,
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
    "mamba2": ConvertedFamily(
        "mamba2",
        _MAMBA2,
        _MAMBA2_KEYS,
        name_aliases=(("mixer.dt_bias", "mixer.dt_proj.bias"),),
        split_tensor=store_mamba2_tensors,
    ),
    "falcon_h1": ConvertedFamily(
        "falcon-h1",
        _FALCON_H1,
        {
            "layer_norm_rms_eps": 1e-5,
            "ssm_conv_kernel": 4,
            "ssm_inner_size": 128,
            "ssm_state_size": 16,
            "ssm_time_step_rank": 8,
            "ssm_group_count": 2,
        },
        name_aliases=(("mamba.dt_bias", "mamba.dt_proj.bias"),),
        split_tensor=store_mamba2_tensors,
    ),
    "jamba": ConvertedFamily(
        "jamba",
        _JAMBA,
        _JAMBA_KEYS,
        name_aliases=(("feed_forward.switch_mlp", "mlp.experts"),),
        split_tensor=store_mamba_tensors,
    ),
    "nemotron_h_moe": ConvertedFamily(
        "nemotron_h_moe",
        _NEMOTRON_H_MOE,
        _NEMOTRON_H_MOE_KEYS,
        rope_permuted=True,
        name_aliases=(
            ("mixer.dt_bias", "mixer.dt_proj.bias"),
            ("gate.e_score_correction_bias", "gate.e_score_correction.bias"),
        ),
        split_tensor=store_nemotron_h_moe_tensors,
    ),
    "nemotron_h": ConvertedFamily(
        "nemotron_h",
        _NEMOTRON_H,
        _NEMOTRON_H_KEYS,
        rope_permuted=True,
        name_aliases=(("mixer.dt_bias", "mixer.dt_proj.bias"),),
        split_tensor=store_mamba2_tensors,
    ),
    # Granite 4.0 H: experts beside a shared MLP, attention without RoPE.
    "granitemoehybrid": ConvertedFamily(
        "granitehybrid",
        _GRANITE_HYBRID
        | {"num_local_experts": 4, "num_experts_per_tok": 2, "shared_intermediate_size": 64},
        _GRANITE_HYBRID_KEYS
        | {"expert_count": 4, "expert_used_count": 2, "expert_shared_feed_forward_length": 64},
        rope_permuted=True,
        name_aliases=_GRANITE_HYBRID_NAMES,
        split_tensor=store_granite_hybrid_tensors,
    ),
    # A dense Granite 4.0 H with RoPE: its MLP has the shared size, no experts.
    "granitemoehybrid_dense": ConvertedFamily(
        "granitehybrid",
        _GRANITE_HYBRID
        | {"intermediate_size": 64, "position_embedding_type": "rope", "tie_word_embeddings": True},
        _GRANITE_HYBRID_KEYS
        | {
            "feed_forward_length": 96,
            "expert_count": 0,
            "expert_shared_feed_forward_length": 64,
            "rope_scaling_finetuned": True,
        },
        rope_permuted=True,
        name_aliases=_GRANITE_HYBRID_NAMES,
        split_tensor=store_granite_hybrid_tensors,
    ),
    "lfm2": ConvertedFamily(
        "lfm2",
        _LFM2,
        {"layer_norm_rms_eps": 1e-5, "head_count_kv": [0, 2, 0, 0], "shortconv_l_cache": 3},
        split_tensor=squeeze_short_conv,
    ),
    "lfm2_moe": ConvertedFamily(
        "lfm2moe",
        _LFM2_MOE,
        {
            "layer_norm_rms_eps": 1e-5,
            "head_count_kv": [0, 2, 0, 0],
            "shortconv_l_cache": 3,
            "expert_count": 4,
            "expert_used_count": 2,
            "expert_feed_forward_length": 32,
            "leading_dense_block_count": 1,
            "expert_gating_func": gguf.ExpertGatingFuncType.SIGMOID,
        },
        name_aliases=(
            ("feed_forward.switch_mlp", "feed_forward.experts"),
            ("feed_forward.expert_bias", "feed_forward.expert_bias.bias"),
        ),
        split_tensor=squeeze_short_conv,
    ),
    "qwen3_next": ConvertedFamily(
        "qwen3next",
        _QWEN3_NEXT,
        _QWEN3_NEXT_KEYS,
        name_aliases=(
            ("switch_mlp", "experts"),
            ("linear_attn.dt_bias", "linear_attn.dt_proj.bias"),
        ),
        split_tensor=split_in_proj_qkvz,
    ),
    "rwkv7": ConvertedFamily(
        "rwkv7",
        _RWKV7,
        _RWKV7_KEYS,
        name_aliases=RWKV7_NAMES,
        split_tensor=convert_rwkv7,
        merge_tensors=stack_rwkv7_mixes,
    ),
}
