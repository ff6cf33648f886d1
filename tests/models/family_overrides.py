"""Per-family settings of the tiny parity-test models (`family_configs`): the config fields
`SMALL` does not cover, each family's features switched on, and the gains that keep a
random tiny model from repeating its input."""

from __future__ import annotations

from typing import Any

from factories import byte_level_vocab

VOCAB_SIZE = len(byte_level_vocab()[0])
SLIDING_WINDOW = 6
"""Tokens a sliding-window layer sees: shorter than every prompt of the parity test."""

# The fields of a `text_config` (a multimodal checkpoint's language model): module and class.
TEXT_ARGS: dict[str, tuple[str, str]] = {
    "gemma3": ("gemma3_text", "ModelArgs"),
    "gemma3n": ("gemma3n", "TextConfig"),
    "gemma4": ("gemma4_text", "ModelArgs"),
    "llama4": ("llama4", "TextArgs"),
    "kimi_k25": ("deepseek_v3", "ModelArgs"),
    "kimi_k3": ("kimi_k3", "TextArgs"),
    "minimax_m3_vl": ("minimax_m3_vl", "TextArgs"),
    "muse_spark": ("muse_spark", "TextArgs"),
    "qwen3_5": ("qwen3_5", "TextModelArgs"),
    "qwen3_5_moe": ("qwen3_5", "TextModelArgs"),
    "prism_hadamard_qwen35": ("qwen3_5", "TextModelArgs"),
}

# Families whose tiny models otherwise repeat their last input token (see `amplify_layers`).
LAYER_GAIN: dict[str, float] = {
    name: 3.0
    for name in (
        "afm7",
        "cohere",
        "cohere2",
        "gemma",
        "gemma2",
        "gemma3n",
        "gpt2",
        "hunyuan",
        "lfm2",
        "lfm2_moe",
        "lille-130m",
        "openelm",
    )
} | {"phi3small": 5.0}
# Families whose embedding, scaled with a tied LM head, would outweigh normalized layer
# outputs: their logits are sharpened less (default 4).
LOGIT_SHARPENING: dict[str, float] = {"gemma2": 0.5, "gemma3n": 0.5, "phi3small": 1.0}

_SLIDING_THEN_FULL = ["sliding_attention", "full_attention"]
_QWEN3_5_TEXT = {
    "linear_num_value_heads": 2,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "full_attention_interval": 2,
}

# Per family: what `SMALL` does not cover, and the family's features switched on
# (for a multimodal checkpoint, `text_config` holds the overrides of its language model).
OVERRIDES: dict[str, dict[str, Any]] = {
    "Klear": {"mlp_only_layers": [0]},
    "afm7": {
        "hidden_dim": 64,
        "num_layers": 3,
        "num_kv_reuse_layers": 1,
        "num_heads": 4,
        "num_kv_heads": 2,
    },
    "afmoe": {"layer_types": _SLIDING_THEN_FULL, "num_hidden_layers": 2, "num_dense_layers": 1},
    "apertus": {"post_norm": False, "qk_norm": True},
    "baichuan_m1": {"sliding_window_layers": [0], "conv_window": 2},
    "bailing_hybrid": {"layer_group_size": 2, "group_norm_size": 2},
    "bailing_moe_linear": {"layer_group_size": 2, "group_norm_size": 2},
    "cohere": {"use_qk_norm": True},
    "cohere2": {"num_hidden_layers": 2, "sliding_window_pattern": 2},
    "dbrx": {
        "d_model": 64,
        "n_layers": 2,
        "n_heads": 4,
        "ffn_config": {"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2},
        "attn_config": {"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000.0},
    },
    "deepseek_v2": {
        "rope_scaling": {
            "type": "yarn",
            "factor": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 512,
        }
    },
    "exaone4": {"num_hidden_layers": 2, "sliding_window_pattern": "LG"},
    "exaone_moe": {"layer_types": _SLIDING_THEN_FULL, "is_moe_layer": [False, True]},
    "gear": {"layer_types": _SLIDING_THEN_FULL},
    "gemma3": {"text_config": {"sliding_window_pattern": 2}},
    "gemma3_text": {"sliding_window_pattern": 2},
    "gemma3n": {
        "text_config": {
            "num_hidden_layers": 4,
            "num_kv_shared_layers": 2,
            "vocab_size_per_layer_input": 64,
            "rope_local_base_freq": 10000.0,
            "final_logit_softcapping": 30.0,
            "layer_types": _SLIDING_THEN_FULL * 2,
            "activation_sparsity_pattern": [0.0] * 4,
            "hidden_size_per_layer_input": 8,
            "altup_num_inputs": 2,
            "altup_coef_clip": 120.0,
            "altup_correct_scale": True,
            "altup_active_idx": 0,
            "laurel_rank": 8,
        }
    },
    "gemma4": {
        "text_config": {
            "num_hidden_layers": 4,
            "layer_types": _SLIDING_THEN_FULL * 2,
            "num_kv_shared_layers": 2,
            "vocab_size_per_layer_input": VOCAB_SIZE,
            "hidden_size_per_layer_input": 8,
            "global_head_dim": 32,
        }
    },
    "gemma4_text": {
        "num_hidden_layers": 4,
        "layer_types": _SLIDING_THEN_FULL * 2,
        "num_kv_shared_layers": 2,
        "vocab_size_per_layer_input": VOCAB_SIZE,
        "hidden_size_per_layer_input": 8,
        "global_head_dim": 32,
    },
    "glm4_moe": {"use_qk_norm": True},
    "glm_moe_dsa": {
        "index_head_dim": 16,
        "index_n_heads": 2,
        "index_topk": 4,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    },
    "gpt2": {"num_key_value_heads": None},
    "gpt_neox": {"rotary_emb_base": 10000.0, "rotary_pct": 0.5},
    "granite": {
        "logits_scaling": 2.0,
        "attention_multiplier": 0.25,
        "embedding_multiplier": 4.0,
        "residual_multiplier": 0.5,
    },
    "granitemoe": {
        "logits_scaling": 2.0,
        "attention_multiplier": 0.25,
        "embedding_multiplier": 4.0,
        "residual_multiplier": 0.5,
    },
    "granitemoehybrid": {
        "logits_scaling": 2.0,
        "attention_multiplier": 0.25,
        "embedding_multiplier": 4.0,
        "residual_multiplier": 0.5,
        "layer_types": ["mamba", "attention"],
        "mamba_n_heads": 4,
        "mamba_d_head": 16,
        "mamba_proj_bias": False,
        "mamba_d_state": 8,
        "mamba_d_conv": 4,
        "mamba_n_groups": 1,
        "mamba_conv_bias": True,
        "shared_intermediate_size": 32,
    },
    "hunyuan": {
        "num_shared_expert": 1,
        "use_mixed_mlp_moe": True,
        "use_cla": False,
        "cla_share_factor": 1,
        "rope_scaling": {"alpha": 1.0, "factor": 1.0, "type": "dynamic"},
    },
    "jamba": {
        "attn_layer_offset": 1,
        "attn_layer_period": 2,
        "expert_layer_offset": 1,
        "expert_layer_period": 2,
        "mamba_d_conv": 4,
        "mamba_d_state": 8,
        "mamba_expand": 2,
    },
    "kimi_k25": {"text_config": {}},
    "kimi_k3": {
        "text_config": {
            "linear_attn_config": {
                "kda_layers": [1],
                "full_attn_layers": [2],
                "num_heads": 4,
                "head_dim": 16,
                "short_conv_kernel_size": 4,
            },
            "q_lora_rank": 24,
            "kv_lora_rank": 16,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 16,
            "num_experts": 4,
            "num_experts_per_token": 2,
            "moe_intermediate_size": 32,
        }
    },
    "kimi_linear": {
        "linear_attn_config": {
            "kda_layers": [1],
            "full_attn_layers": [2],
            "num_heads": 4,
            "head_dim": 16,
            "short_conv_kernel_size": 4,
        },
        "model_max_length": 512,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "num_experts_per_token": 2,
    },
    "lfm2": {
        "conv_bias": False,
        "conv_L_cache": 3,
        "block_dim": 64,
        "block_multiple_of": 16,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": False,
        "full_attn_idxs": [1],
    },
    "lfm2_moe": {
        "use_expert_bias": True,
        "conv_bias": False,
        "conv_L_cache": 3,
        "full_attn_idxs": [1],
    },
    "lille-130m": {"block_size": 512, "n_kv_heads": 2},
    "llama": {"layer_types": _SLIDING_THEN_FULL},
    "llama4": {
        "text_config": {
            "attention_chunk_size": 4,
            "interleave_moe_layer_step": 1,
            "intermediate_size_mlp": 96,
            "num_hidden_layers": 4,
            "use_qk_norm": True,
            "rope_scaling": None,
            "num_experts_per_tok": 1,
        }
    },
    "llama4_text": {"intermediate_size_mlp": 96, "no_rope_layers": [1, 0], "use_qk_norm": True},
    "longcat_flash": {
        "attention_method": "MLA",
        "zero_expert_type": "identity",
        "ffn_hidden_size": 96,
        "expert_ffn_hidden_size": 32,
        "zero_expert_num": 1,
        "mla_scale_q_lora": True,
        "mla_scale_kv_lora": True,
    },
    "longcat_flash_ngram": {
        "ffn_hidden_size": 96,
        "expert_ffn_hidden_size": 32,
        "zero_expert_num": 1,
        "mla_scale_q_lora": True,
        "mla_scale_kv_lora": True,
    },
    "mamba": {"state_size": 8, "conv_kernel": 4, "use_conv_bias": True, "time_step_rank": 8},
    "mamba2": {
        "num_heads": 4,
        "head_dim": 32,
        "state_size": 8,
        "conv_kernel": 4,
        "n_groups": 1,
        "use_conv_bias": True,
        "time_step_limit": [0.0, 100.0],
        "time_step_rank": 8,
    },
    "mellum": {
        "layer_types": ["sliding_attention", "full_attention"],
        "rope_parameters": {
            "sliding_attention": {"rope_theta": 10000.0},
            "full_attention": {"rope_theta": 10000.0},
        },
    },
    "mimo_v2_flash": {
        "hybrid_layer_pattern": [1, 0],
        "moe_layer_freq": [0, 1],
        "add_swa_attention_sink_bias": True,
        "add_full_attention_sink_bias": False,
        "sliding_window_size": SLIDING_WINDOW,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "layernorm_epsilon": 1e-5,
        "swa_rope_theta": 10000.0,
        "swa_num_attention_heads": 4,
        "swa_num_key_value_heads": 2,
        "swa_head_dim": 16,
        "swa_v_head_dim": 16,
    },
    "minicpm": {"dim_model_base": 32, "scale_depth": 1.4, "scale_emb": 4.0},
    "minicpm3": {
        "dim_model_base": 32,
        "scale_depth": 1.4,
        "scale_emb": 4.0,
        "rope_scaling": {
            "type": "longrope",
            "original_max_position_embeddings": 512,
            "short_factor": [1.0] * 4,
            "long_factor": [1.0] * 4,
        },
    },
    "ministral3": {
        "layer_types": _SLIDING_THEN_FULL,
        "rope_parameters": {
            "rope_theta": 10000.0,
            "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": 512,
        },
    },
    "mistral4": {
        "rope_parameters": {
            "rope_theta": 10000.0,
            "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": 512,
        }
    },
    "minimax": {"shared_intermediate_size": 32},
    "minimax_m3_vl": {
        "text_config": {
            "moe_layer_freq": [0, 1],
            "dense_intermediate_size": 96,
            "num_local_experts": 4,
        }
    },
    "muse_spark": {
        "text_config": {
            "post_norm_eps": 1e-5,
            "rope_parameters": {"rope_theta": 10000.0},
            "layer_rope_theta": [10000.0, 10000.0],
            "layer_types": _SLIDING_THEN_FULL,
            "final_logit_softcapping": 30.0,
            "output_multiplier": 1.0,
            "moe_hidden_size": 32,
            "mlp_layer_types": ["sparse", "sparse"],
            # mlx-lm's module refuses shared (dense) experts.
            "num_shared_experts": 0,
        }
    },
    "nemotron": {"hidden_act": "relu2"},
    "nemotron-nas": {
        # The middle layer has no attention: mlx-lm makes caches for the other two only.
        "block_configs": [
            {
                "attention": {"no_op": False, "replace_with_linear": False, "n_heads_in_group": 2},
                "ffn": {"no_op": False, "replace_with_linear": False, "ffn_mult": 1.5},
            },
            {
                "attention": {"no_op": True, "replace_with_linear": False},
                "ffn": {"no_op": False, "replace_with_linear": False, "ffn_mult": 1.5},
            },
            {
                "attention": {"no_op": False, "replace_with_linear": False, "n_heads_in_group": 2},
                "ffn": {"no_op": False, "replace_with_linear": False, "ffn_mult": 1.5},
            },
        ],
        "num_hidden_layers": 3,
    },
    "nemotron_h": {
        "mamba_num_heads": 4,
        "mamba_head_dim": 16,
        "mamba_proj_bias": False,
        "ssm_state_size": 8,
        "conv_kernel": 4,
        "n_groups": 1,
        "use_conv_bias": True,
        "hybrid_override_pattern": "M*",
    },
    "olmo_hybrid": {
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "linear_allow_neg_eigval": False,
    },
    "olmo3": {"layer_types": _SLIDING_THEN_FULL},
    "openelm": {
        "num_transformer_layers": 2,
        "model_dim": 64,
        "ffn_dim_divisor": 16,
        "num_query_heads": [4, 4],
        "num_kv_heads": [2, 2],
        "ffn_multipliers": [1.0, 1.5],
    },
    # Its LM head masks token ids from 100256 on by index, so its vocabulary must reach
    # past them (an index outside the logits corrupts memory on the CPU); narrow layers
    # keep the embedding small.
    "phi3small": {
        "vocab_size": 100352,
        "hidden_size": 16,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "dense_attention_every_n_layers": 2,
        "ff_intermediate_size": 96,
        "gegelu_limit": 20.0,
        "blocksparse_block_size": 32,
        "blocksparse_num_local_blocks": 2,
        "blocksparse_vert_stride": 2,
    },
    "phixtral": {"num_vocab": VOCAB_SIZE, "model_dim": 64, "num_heads": 4, "num_layers": 2},
    "plamo": {"n_shared_head": 2},
    "plamo2": {
        "attention_window_size": SLIDING_WINDOW,
        "mamba_chunk_size": 8,
        "hidden_size_per_head": 16,
        "mamba_d_state": 8,
        "mamba_num_heads": 4,
    },
    "plamo3": {"window_size": SLIDING_WINDOW},
    # A text-only 2-bit Hadamard pack (`family_configs.write_hadamard_pack`): packed
    # widths are multiples of 128, rotated blocks 512 positions or more.
    "prism_hadamard_qwen35": {
        "text_config": {**_QWEN3_5_TEXT, "hidden_size": 512},
        "schema_version": 1,
        "tensor_namespace": "mlx-lm-text",
        "gdn_activation_layout": "grouped",
        "quantization": {"bits": 2, "group_size": 128, "mode": "affine"},
        "modules": [
            {"path": "model.embed_tokens", "embedding": True, "dtype": "float16", "block": 512},
            {
                "path": "model.layers.0.linear_attn.in_proj_qkv",
                "embedding": False,
                "dtype": "float16",
                "block": 512,
            },
            {"path": "lm_head", "embedding": False, "dtype": "float16", "block": 0},
        ],
    },
    "qwen": {"kv_channels": 16, "intermediate_size": 192},
    "qwen3_5": {"text_config": _QWEN3_5_TEXT},
    "qwen3_5_moe": {"text_config": {**_QWEN3_5_TEXT, "num_experts": 4, "num_experts_per_tok": 2}},
    "qwen3_next": {
        "linear_num_value_heads": 2,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 2,
    },
    "recurrent_gemma": {
        "conv1d_width": 4,
        "logits_soft_cap": 30.0,
        "attention_window_size": SLIDING_WINDOW,
        "block_types": ["recurrent", "attention"],
    },
    "rwkv7": {
        "a_low_rank_dim": 8,
        "v_low_rank_dim": 8,
        "gate_low_rank_dim": 8,
        "decay_low_rank_dim": 8,
    },
    "spark2_5": {
        "layer_types": _SLIDING_THEN_FULL,
        "rope_parameters": {
            "sliding_attention": {"rope_theta": 10000.0},
            "full_attention": {"rope_theta": 10000.0},
        },
    },
    "stablelm": {"use_qkv_bias": True},
    "step3p5": {
        "num_attention_groups": 2,
        "moe_num_experts": 4,
        "share_expert_dim": 32,
        "moe_top_k": 2,
    },
}
