"""Tiny random-weight mlx-lm models of each engine cache kind, built from config dicts.

Each has an untied LM head (a tied one makes a random model repeat its last token), a
64-token vocabulary and a few layers of width 32:

- `mamba`, `mamba2`: recurrent layers only (a convolution state and an SSM state);
- `jamba`: Mamba layers and attention layers, MoE every other layer;
- `qwen3_next`: gated delta-net layers and gated attention layers (partial RoPE, MoE);
- `falcon_h1`: each layer a Mamba-2 mixer beside attention (mlx-lm's `CacheList`);
- `recurrent_gemma`: RG-LRU recurrent layers and local attention over a window of 8
  (every attention layer windowed, so blocks behind the window are freed);
- `step3p5`: attention layers all windowed (8 positions), no recurrent state;
- `gemma3_text`: windowed (8 positions) and full-attention layers alternating (sliding
  window pattern 2), QK-norm, local and global RoPE bases;
- `gpt_oss`: windowed and full-attention layers alternating, with attention sinks and
  MoE layers.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from mlxcel_models.language_model import MlxLmLanguageModel
from mlxcel_models.mlx_lm_models import make_mlx_lm_model

WINDOW = 8

CONFIGS: dict[str, dict[str, Any]] = {
    "mamba": {
        "model_type": "mamba",
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "state_size": 8,
        "num_hidden_layers": 2,
        "conv_kernel": 4,
        "use_bias": False,
        "use_conv_bias": True,
        "time_step_rank": 4,
        "tie_word_embeddings": False,
    },
    "mamba2": {
        "model_type": "mamba2",
        "num_heads": 4,
        "head_dim": 8,
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 32,
        "state_size": 8,
        "num_hidden_layers": 2,
        "layer_norm_epsilon": 1e-5,
        "conv_kernel": 4,
        "n_groups": 1,
        "use_bias": False,
        "use_conv_bias": True,
        "tie_word_embeddings": False,
        "time_step_limit": (0.0, float("inf")),
        "time_step_rank": 4,
    },
    "jamba": {
        "model_type": "jamba",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "attn_layer_offset": 1,
        "attn_layer_period": 2,
        "expert_layer_offset": 1,
        "expert_layer_period": 2,
        "mamba_d_conv": 4,
        "mamba_d_state": 8,
        "mamba_expand": 2,
        "num_experts": 2,
        "num_experts_per_tok": 1,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 256,
        "vocab_size": 64,
        "tie_word_embeddings": False,
    },
    "qwen3_next": {
        "model_type": "qwen3_next",
        "hidden_size": 32,
        "num_hidden_layers": 4,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "linear_num_value_heads": 2,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4,
        "num_experts": 2,
        "num_experts_per_tok": 1,
        "decoder_sparse_step": 1,
        "shared_expert_intermediate_size": 32,
        "mlp_only_layers": [],
        "moe_intermediate_size": 32,
        "rms_norm_eps": 1e-6,
        "vocab_size": 64,
        "num_key_value_heads": 2,
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "max_position_embeddings": 256,
        "head_dim": 8,
        "full_attention_interval": 2,
    },
    "falcon_h1": {
        "model_type": "falcon_h1",
        "head_dim": 8,
        "hidden_size": 32,
        "intermediate_size": 64,
        "mamba_d_conv": 4,
        "mamba_d_head": 8,
        "mamba_d_ssm": 32,
        "mamba_d_state": 8,
        "mamba_expand": 1,
        "mamba_n_groups": 1,
        "mamba_n_heads": 4,
        "mamba_chunk_size": 8,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "vocab_size": 64,
        "tie_word_embeddings": False,
    },
    "recurrent_gemma": {
        "model_type": "recurrent_gemma",
        "attention_bias": False,
        "conv1d_width": 4,
        "hidden_size": 32,
        "intermediate_size": 64,
        "logits_soft_cap": 30.0,
        "num_attention_heads": 4,
        "num_hidden_layers": 3,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_window_size": WINDOW,
        "vocab_size": 64,
        "block_types": ["recurrent", "recurrent", "attention"],
    },
    "step3p5": {
        "model_type": "step3p5",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "vocab_size": 64,
        "num_attention_heads": 4,
        "num_attention_groups": 2,
        "head_dim": 8,
        "intermediate_size": 64,
        "sliding_window": WINDOW,
        "layer_types": ["sliding_attention"] * 2,
        "moe_num_experts": 2,
        "moe_top_k": 1,
        "moe_intermediate_size": 32,
        "share_expert_dim": 32,
        "moe_layers_enum": "1",
        "tie_word_embeddings": False,
    },
    "gemma3_text": {
        "model_type": "gemma3_text",
        "hidden_size": 32,
        "num_hidden_layers": 4,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "query_pre_attn_scalar": 8,
        "vocab_size": 64,
        "rope_theta": 10000.0,
        "rope_local_base_freq": 1000.0,
        "sliding_window": WINDOW,
        "sliding_window_pattern": 2,
        "max_position_embeddings": 256,
    },
    "gpt_oss": {
        "model_type": "gpt_oss",
        "hidden_size": 32,
        "num_hidden_layers": 4,
        "num_local_experts": 2,
        "num_experts_per_tok": 1,
        "intermediate_size": 32,
        "head_dim": 8,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 64,
        "sliding_window": WINDOW,
        "rope_theta": 10000,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    },
}


def make_model(name: str, seed: int = 0) -> MlxLmLanguageModel:
    """The family's tiny model with seeded random weights, evaluated."""
    mx.random.seed(seed)
    module = make_mlx_lm_model(CONFIGS[name], where=name)
    mx.eval(module.parameters())
    return MlxLmLanguageModel(module)
