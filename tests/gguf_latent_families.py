"""Tiny mlx-lm families with multi-head latent attention (DeepSeek V2/V3, MiniCPM 3)
written as llama.cpp's converter writes them, beside `gguf_families.MORE_FAMILIES`."""

from __future__ import annotations

import gguf

from gguf_conversions import add_longrope_factors, split_kv_b
from gguf_models import ConvertedFamily, tiny_config

_RMS = {"layer_norm_rms_eps": 1e-5}
_SWITCH = (("switch_mlp", "experts"),)

_MLA = {
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "q_lora_rank": 64,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 32,
    "v_head_dim": 16,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "first_k_dense_replace": 1,
    "rope_scaling": {
        "type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
}
# What the converter writes for _MLA: multi-query attention over the latent.
_MLA_KEYS = _RMS | {
    "head_count_kv": 1,
    "key_length": 32 + 8,
    "value_length": 32,
    "key_length_mla": 32 + 8,
    "value_length_mla": 16,
    "rope_dimension_count": 8,
    "kv_lora_rank": 32,
    "q_lora_rank": 64,
    "leading_dense_block_count": 1,
    "expert_count": 4,
    "expert_used_count": 2,
    "expert_shared_count": 1,
    "expert_feed_forward_length": 32,
    "rope_scaling_type": gguf.RopeScalingType.YARN,
    "rope_scaling_factor": 4.0,
    "rope_scaling_orig_ctx_len": 64,
    "rope_scaling_yarn_beta_fast": 32.0,
    "rope_scaling_yarn_beta_slow": 1.0,
    "rope_scaling_yarn_log_mul": 0.1,
}


LATENT_FAMILIES = {
    "deepseek_v2": ConvertedFamily(
        "deepseek2",
        tiny_config("deepseek_v2", **_MLA, topk_method="greedy"),
        _MLA_KEYS | {"expert_gating_func": gguf.ExpertGatingFuncType.SOFTMAX},
        name_aliases=_SWITCH,
        split_tensor=split_kv_b,
    ),
    # A file from the converters before the split: kv_b_proj whole, per-head sizes as the
    # key and value lengths, and no query LoRA.
    "deepseek_v2_whole_kv_b": ConvertedFamily(
        "deepseek2",
        tiny_config("deepseek_v2", **_MLA | {"q_lora_rank": None}, topk_method="greedy"),
        {
            key: value
            for key, value in _MLA_KEYS.items()
            if key not in ("key_length_mla", "value_length_mla", "q_lora_rank")
        }
        | {"head_count_kv": 4, "key_length": 40, "value_length": 16},
        name_aliases=_SWITCH,
    ),
    "deepseek_v3": ConvertedFamily(
        "deepseek2",
        tiny_config("deepseek_v3", **_MLA, routed_scaling_factor=2.5, norm_topk_prob=True),
        _MLA_KEYS
        | {
            "expert_gating_func": gguf.ExpertGatingFuncType.SIGMOID,
            "expert_weights_scale": 2.5,
            "expert_weights_norm": True,
        },
        name_aliases=(
            *_SWITCH,
            ("embed_q", "k_b_proj"),
            ("unembed_out", "v_b_proj"),
            ("e_score_correction_bias", "e_score_correction.bias"),
        ),
    ),
    "minicpm3": ConvertedFamily(
        "minicpm3",
        tiny_config(
            "minicpm3",
            num_key_value_heads=4,
            q_lora_rank=32,
            kv_lora_rank=32,
            qk_nope_head_dim=8,
            qk_rope_head_dim=8,
            scale_emb=12.0,
            scale_depth=1.4,
            dim_model_base=256,
            rope_scaling={
                "original_max_position_embeddings": 256,
                "long_factor": [1.0, 1.5, 2.0, 4.0],
                "short_factor": [1.0, 1.0, 1.2, 1.3],
            },
        ),
        _RMS
        | {
            "head_count_kv": 4,
            "key_length": 16,
            "rope_dimension_count": 8,
            "q_lora_rank": 32,
            "kv_lora_rank": 32,
        },
        split_tensor=add_longrope_factors,
    ),
}
