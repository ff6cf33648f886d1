"""Tiny random-weight configurations of every mlx-lm text family, and folders written from them.

`family_config(name)` starts from the family's `ModelArgs` fields: every field named in
`SMALL` takes its small value (whatever mlx-lm's default), then `OVERRIDES[name]` switches
on the family's own features (sliding windows shorter than the test's sequences, MoE with
several experts, MLA ranks, soft-capping, sinks …). `write_family_model` builds the model
with mlx-lm, sharpens its logits (see `sharpen_logits`) and saves it as a Hugging Face
folder with a byte-level BPE tokenizer.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.utils import MODEL_REMAPPING

from factories import byte_level_vocab, write_tokenizer

VOCAB_SIZE = len(byte_level_vocab()[0])
SLIDING_WINDOW = 6
"""Tokens a sliding-window layer sees: shorter than every prompt of the parity test."""

MAX_PARAMETERS = 2_000_000

# Small values for the fields many families share; only fields a family declares are set.
SMALL: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_layers": 2,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-5,
    "layer_norm_eps": 1e-5,
    "layer_norm_epsilon": 1e-5,
    "norm_eps": 1e-5,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 32,
    "num_experts": 4,
    "n_routed_experts": 4,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "num_shared_experts": 1,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.0,
    "kv_lora_rank": 16,
    "q_lora_rank": 24,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "sliding_window": SLIDING_WINDOW,
    "sliding_window_pattern": 2,
    "rope_scaling": None,
    "use_bias": False,
    "mlp_bias": False,
    "use_qk_norm": True,
    "qk_norm": True,
    "partial_rotary_factor": 0.5,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_dense_layers": 1,
    "num_nextn_predict_layers": 0,
    "query_pre_attn_scalar": 16,
    "n_embd": 64,
    "n_head": 4,
    "n_layer": 2,
    "n_inner": 96,
    "n_ctx": 512,
    "n_positions": 512,
    "moe_topk": 2,
    "moe_num_experts": 4,
    "moe_k": 2,
    "rotary_dim": 8,
    "original_max_position_embeddings": 512,
}

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
    for name in ("afm7", "cohere", "cohere2", "gemma", "gemma2", "gemma3n", "gpt2", "hunyuan",
                 "lille-130m", "openelm")
} | {"phi3small": 5.0}
# Families whose embedding, scaled with a tied LM head, would outweigh normalized layer
# outputs: their logits are sharpened less (default 4).
LOGIT_SHARPENING: dict[str, float] = {"gemma2": 0.5, "gemma3n": 0.5}

_SLIDING_THEN_FULL = ["sliding_attention", "full_attention"]
_QWEN3_5_TEXT = {"linear_num_value_heads": 2, "linear_num_key_heads": 2,
                 "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                 "full_attention_interval": 2}

# Per family: what `SMALL` does not cover, and the family's features switched on
# (for a multimodal checkpoint, `text_config` holds the overrides of its language model).
OVERRIDES: dict[str, dict[str, Any]] = {
    "Klear": {"mlp_only_layers": [0]},
    "afm7": {"hidden_dim": 64, "num_layers": 3, "num_kv_reuse_layers": 1, "num_heads": 4,
             "num_kv_heads": 2},
    "afmoe": {"layer_types": _SLIDING_THEN_FULL, "num_hidden_layers": 2, "num_dense_layers": 1},
    "apertus": {"post_norm": False, "qk_norm": True},
    "baichuan_m1": {"sliding_window_layers": [0], "conv_window": 2},
    "bailing_hybrid": {"layer_group_size": 2, "group_norm_size": 2},
    "bailing_moe_linear": {"layer_group_size": 2, "group_norm_size": 2},
    "cohere": {"use_qk_norm": True},
    "cohere2": {"num_hidden_layers": 2, "sliding_window_pattern": 2},
    "dbrx": {"d_model": 64, "n_layers": 2, "n_heads": 4,
             "ffn_config": {"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2},
             "attn_config": {"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 10000.0}},
    "deepseek_v2": {"rope_scaling": {"type": "yarn", "factor": 1.0, "mscale": 1.0,
                                     "mscale_all_dim": 1.0,
                                     "original_max_position_embeddings": 512}},
    "exaone4": {"num_hidden_layers": 2, "sliding_window_pattern": "LG"},
    "exaone_moe": {"layer_types": _SLIDING_THEN_FULL, "is_moe_layer": [False, True]},
    "gear": {"layer_types": _SLIDING_THEN_FULL},
    "gemma3": {"text_config": {"sliding_window_pattern": 2}},
    "gemma3_text": {"sliding_window_pattern": 2},
    "gemma3n": {"text_config": {
        "num_hidden_layers": 4, "num_kv_shared_layers": 2, "vocab_size_per_layer_input": 64,
        "rope_local_base_freq": 10000.0, "final_logit_softcapping": 30.0,
        "layer_types": _SLIDING_THEN_FULL * 2, "activation_sparsity_pattern": [0.0] * 4,
        "hidden_size_per_layer_input": 8, "altup_num_inputs": 2, "altup_coef_clip": 120.0,
        "altup_correct_scale": True, "altup_active_idx": 0, "laurel_rank": 8}},
    "gemma4": {"text_config": {"layer_types": _SLIDING_THEN_FULL, "num_kv_shared_layers": 0,
                               "vocab_size_per_layer_input": VOCAB_SIZE,
                               "hidden_size_per_layer_input": 8, "global_head_dim": 32}},
    "gemma4_text": {"layer_types": _SLIDING_THEN_FULL, "num_kv_shared_layers": 0,
                    "vocab_size_per_layer_input": VOCAB_SIZE, "hidden_size_per_layer_input": 8,
                    "global_head_dim": 32},
    "glm4_moe": {"use_qk_norm": True},
    "glm_moe_dsa": {"index_head_dim": 16, "index_n_heads": 2, "index_topk": 4,
                    "topk_method": "noaux_tc", "scoring_func": "sigmoid",
                    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}},
    "gpt2": {"num_key_value_heads": None},
    "gpt_neox": {"rotary_emb_base": 10000.0, "rotary_pct": 0.5},
    "granite": {"logits_scaling": 2.0, "attention_multiplier": 0.25,
                "embedding_multiplier": 4.0, "residual_multiplier": 0.5},
    "granitemoe": {"logits_scaling": 2.0, "attention_multiplier": 0.25,
                   "embedding_multiplier": 4.0, "residual_multiplier": 0.5},
    "granitemoehybrid": {"logits_scaling": 2.0, "attention_multiplier": 0.25,
                         "embedding_multiplier": 4.0, "residual_multiplier": 0.5,
                         "layer_types": ["mamba", "attention"], "mamba_n_heads": 4,
                         "mamba_d_head": 16, "mamba_proj_bias": False, "mamba_d_state": 8,
                         "mamba_d_conv": 4, "mamba_n_groups": 1, "mamba_conv_bias": True,
                         "shared_intermediate_size": 32},
    "hunyuan": {"num_shared_expert": 1, "use_mixed_mlp_moe": True, "use_cla": False,
                "cla_share_factor": 1, "rope_scaling": {"alpha": 1.0, "factor": 1.0, "type": "dynamic"}},
    "jamba": {"attn_layer_offset": 1, "attn_layer_period": 2, "expert_layer_offset": 1,
              "expert_layer_period": 2, "mamba_d_conv": 4, "mamba_d_state": 8,
              "mamba_expand": 2},
    "kimi_k25": {"text_config": {}},
    "kimi_k3": {"text_config": {
        "linear_attn_config": {"kda_layers": [1], "full_attn_layers": [2], "num_heads": 4,
                               "head_dim": 16, "short_conv_kernel_size": 4},
        "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
        "v_head_dim": 16, "num_experts": 4, "num_experts_per_token": 2,
        "moe_intermediate_size": 32}},
    "kimi_linear": {"linear_attn_config": {"kda_layers": [1], "full_attn_layers": [2],
                                           "num_heads": 4, "head_dim": 16,
                                           "short_conv_kernel_size": 4},
                    "model_max_length": 512, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                    "v_head_dim": 16, "num_experts_per_token": 2},
    "lfm2": {"conv_bias": False, "conv_L_cache": 3, "block_dim": 64, "block_multiple_of": 16,
             "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": False,
             "full_attn_idxs": [1]},
    "lfm2_moe": {"use_expert_bias": True, "conv_bias": False, "conv_L_cache": 3,
                 "full_attn_idxs": [1]},
    "lille-130m": {"block_size": 512, "n_kv_heads": 2},
    "llama": {"layer_types": _SLIDING_THEN_FULL},
    "llama4": {"text_config": {"attention_chunk_size": 4, "interleave_moe_layer_step": 1,
                               "intermediate_size_mlp": 96, "num_hidden_layers": 4,
                               "use_qk_norm": True, "rope_scaling": None,
                               "num_experts_per_tok": 1}},
    "llama4_text": {"intermediate_size_mlp": 96, "no_rope_layers": [1, 0], "use_qk_norm": True},
    "longcat_flash": {"attention_method": "MLA", "zero_expert_type": "identity",
                      "ffn_hidden_size": 96, "expert_ffn_hidden_size": 32, "zero_expert_num": 1,
                      "mla_scale_q_lora": True, "mla_scale_kv_lora": True},
    "longcat_flash_ngram": {"ffn_hidden_size": 96, "expert_ffn_hidden_size": 32,
                            "zero_expert_num": 1, "mla_scale_q_lora": True,
                            "mla_scale_kv_lora": True},
    "mamba": {"state_size": 8, "conv_kernel": 4, "use_conv_bias": True, "time_step_rank": 8},
    "mamba2": {"num_heads": 4, "head_dim": 32, "state_size": 8, "conv_kernel": 4,
               "n_groups": 1, "use_conv_bias": True, "time_step_limit": [0.0, 100.0],
               "time_step_rank": 8},
    "mellum": {"layer_types": ["sliding_attention", "full_attention"],
               "rope_parameters": {"sliding_attention": {"rope_theta": 10000.0},
                                   "full_attention": {"rope_theta": 10000.0}}},
    "mimo_v2_flash": {"hybrid_layer_pattern": [1, 0], "moe_layer_freq": [0, 1], "add_swa_attention_sink_bias": True,
                      "add_full_attention_sink_bias": False,
                      "sliding_window_size": SLIDING_WINDOW, "topk_method": "noaux_tc",
                      "scoring_func": "sigmoid", "layernorm_epsilon": 1e-5,
                      "swa_rope_theta": 10000.0, "swa_num_attention_heads": 4,
                      "swa_num_key_value_heads": 2, "swa_head_dim": 16, "swa_v_head_dim": 16},
    "minicpm": {"dim_model_base": 32, "scale_depth": 1.4, "scale_emb": 4.0},
    "minicpm3": {"dim_model_base": 32, "scale_depth": 1.4, "scale_emb": 4.0,
                 "rope_scaling": {"type": "longrope", "original_max_position_embeddings": 512,
                                  "short_factor": [1.0] * 4, "long_factor": [1.0] * 4}},
    "ministral3": {"layer_types": _SLIDING_THEN_FULL,
                   "rope_parameters": {"rope_theta": 10000.0, "llama_4_scaling_beta": 0.1,
                                       "original_max_position_embeddings": 512}},
    "mistral4": {"rope_parameters": {"rope_theta": 10000.0, "llama_4_scaling_beta": 0.1,
                                     "original_max_position_embeddings": 512}},
    "minimax": {"shared_intermediate_size": 32},
    "minimax_m3_vl": {"text_config": {"moe_layer_freq": [0, 1], "dense_intermediate_size": 96,
                                      "num_local_experts": 4}},
    "muse_spark": {"text_config": {
        "post_norm_eps": 1e-5, "rope_parameters": {"rope_theta": 10000.0},
        "layer_rope_theta": [10000.0, 10000.0], "layer_types": _SLIDING_THEN_FULL,
        "final_logit_softcapping": 30.0, "output_multiplier": 1.0, "moe_hidden_size": 32,
        "mlp_layer_types": ["sparse", "sparse"]}},
    "nemotron": {"hidden_act": "relu2"},
    "nemotron-nas": {"block_configs": [
        {"attention": {"no_op": False, "replace_with_linear": False, "n_heads_in_group": 2},
         "ffn": {"no_op": False, "replace_with_linear": False, "ffn_mult": 1.5}}] * 2},
    "nemotron_h": {"mamba_num_heads": 4, "mamba_head_dim": 16, "mamba_proj_bias": False,
                   "ssm_state_size": 8, "conv_kernel": 4, "n_groups": 1, "use_conv_bias": True,
                   "hybrid_override_pattern": "M*"},
    "olmo_hybrid": {"linear_num_key_heads": 2, "linear_num_value_heads": 2,
                    "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                    "linear_conv_kernel_dim": 4, "linear_allow_neg_eigval": False},
    "olmo3": {"layer_types": _SLIDING_THEN_FULL},
    "openelm": {"num_transformer_layers": 2, "model_dim": 64, "ffn_dim_divisor": 16,
                "num_query_heads": [4, 4], "num_kv_heads": [2, 2], "ffn_multipliers": [1.0, 1.5]},
    "phi3small": {"dense_attention_every_n_layers": 2, "ff_intermediate_size": 96,
                  "gegelu_limit": 20.0, "blocksparse_block_size": 32,
                  "blocksparse_num_local_blocks": 2, "blocksparse_vert_stride": 2},
    "phixtral": {"num_vocab": VOCAB_SIZE, "model_dim": 64, "num_heads": 4, "num_layers": 2},
    "plamo": {"n_shared_head": 2},
    "plamo2": {"attention_window_size": SLIDING_WINDOW, "mamba_chunk_size": 8,
               "hidden_size_per_head": 16, "mamba_d_state": 8, "mamba_num_heads": 4},
    "plamo3": {"window_size": SLIDING_WINDOW},
    "prism_hadamard_qwen35": {"text_config": _QWEN3_5_TEXT},
    "qwen": {"kv_channels": 16, "intermediate_size": 192},
    "qwen3_5": {"text_config": _QWEN3_5_TEXT},
    "qwen3_5_moe": {"text_config": {**_QWEN3_5_TEXT, "num_experts": 4,
                                    "num_experts_per_tok": 2}},
    "qwen3_next": {"linear_num_value_heads": 2, "linear_num_key_heads": 2,
                   "linear_key_head_dim": 16, "linear_value_head_dim": 16,
                   "linear_conv_kernel_dim": 4},
    "recurrent_gemma": {"conv1d_width": 4, "logits_soft_cap": 30.0,
                        "attention_window_size": SLIDING_WINDOW,
                        "block_types": ["recurrent", "attention"]},
    "rwkv7": {"a_low_rank_dim": 8, "v_low_rank_dim": 8, "gate_low_rank_dim": 8,
              "decay_low_rank_dim": 8},
    "spark2_5": {"layer_types": _SLIDING_THEN_FULL,
                 "rope_parameters": {"sliding_attention": {"rope_theta": 10000.0},
                                     "full_attention": {"rope_theta": 10000.0}}},
    "stablelm": {"use_qkv_bias": True},
    "step3p5": {"num_attention_groups": 2, "moe_num_experts": 4, "share_expert_dim": 32,
                "moe_top_k": 2},
}


def module_name(model_type: str) -> str:
    """The mlx-lm module that runs `model_type` (its `MODEL_REMAPPING` applied)."""
    return MODEL_REMAPPING.get(model_type, model_type)


def family_config(model_type: str) -> dict[str, Any]:
    """A config.json for a tiny model of `model_type`."""
    args = importlib.import_module(f"mlx_lm.models.{module_name(model_type)}").ModelArgs
    module = module_name(model_type)
    config = _small_fields(args)
    config.update(OVERRIDES.get(model_type, OVERRIDES.get(module, {})))
    if module in TEXT_ARGS:
        text_module, text_class = TEXT_ARGS[module]
        text_args = getattr(importlib.import_module(f"mlx_lm.models.{text_module}"), text_class)
        config["text_config"] = {
            "model_type": text_module,
            **_small_fields(text_args),
            **config.get("text_config", {}),
        }
    config["model_type"] = model_type
    return config


def _small_fields(args: type) -> dict[str, Any]:
    fields = {field.name for field in dataclasses.fields(args)}
    return {name: value for name, value in SMALL.items() if name in fields}


def fill_zero_matrices(module: nn.Module) -> None:
    """Give matrices a model initializes to zeros (talkie's LM head) random values."""
    module.update(
        tree_map(
            lambda a: mx.random.normal(a.shape) / a.shape[-1] ** 0.5
            if a.ndim >= 2 and not mx.any(a).item()
            else a,
            module.parameters(),
        )
    )


def amplify_layers(module: nn.Module, gain: float) -> None:
    """Scale every other matrix by `gain`, so the layers' updates outweigh a token's own
    embedding (with tied embeddings and small updates, a random model repeats its input)."""
    module.update(
        tree_map(
            lambda a: a * gain if a.ndim >= 2 and a.shape[0] != VOCAB_SIZE else a,
            module.parameters(),
        )
    )


def sharpen_logits(module: nn.Module, factor: float) -> None:
    """Scale every vocabulary-sized matrix (embedding tables, LM heads) by `factor`.

    Random tiny models have nearly uniform next-token distributions, so two correct
    implementations could pick different argmaxes from rounding alone; scaled heads put
    the winner well clear of the runner-up without changing which model runs.
    """
    scaled = tree_map(
        lambda a: a * factor if a.ndim == 2 and a.shape[0] == VOCAB_SIZE else a,
        module.parameters(),
    )
    module.update(scaled)


def write_family_model(folder: Path, model_type: str, *, seed: int = 0) -> Path:
    """Write a tiny random `model_type` model as a Hugging Face folder (float32)."""
    config = family_config(model_type)
    architecture = importlib.import_module(f"mlx_lm.models.{module_name(model_type)}")
    mx.random.seed(seed)
    module = architecture.Model(architecture.ModelArgs.from_dict(config))
    num_parameters = sum(a.size for _, a in tree_flatten(module.parameters()))
    if num_parameters > MAX_PARAMETERS:
        raise ValueError(f"{model_type}: {num_parameters} parameters; the config is not tiny")
    module.update(tree_map(lambda a: a.astype(mx.float32), module.parameters()))
    fill_zero_matrices(module)
    name = module_name(model_type)
    amplify_layers(module, LAYER_GAIN.get(name, 1.0))
    sharpen_logits(module, LOGIT_SHARPENING.get(name, 4.0))
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(module.parameters())))
    (folder / "config.json").write_text(json.dumps(config))
    write_tokenizer(folder)
    return folder
