"""Family config keys beyond `gguf_config.common_config`, from a GGUF file's metadata.

Each function takes the file's metadata and the common config and returns the keys its
mlx-lm family reads under the family's own names, or the values llama.cpp's converter
stored in another form (MiniCPM's combined scales, Ministral 3's YaRN and attention
temperature) or does not store at all (Gemma 3's local RoPE base, the layer patterns).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_config import GGUFMetadata, gemma_query_scale, layer_pattern
from mlxcel_models.rope import FrequencyFactorRoPE


def gemma2(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "attn_logit_softcapping": float(meta.get("attn_logit_softcapping", 50.0)),
        "final_logit_softcapping": float(meta.get("final_logit_softcapping", 30.0)),
        "query_pre_attn_scalar": gemma_query_scale(meta, config, large_layers=46),
    }


def gemma3(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    # llama.cpp fixes Gemma 3's local RoPE base and its 5 local : 1 global layer pattern.
    return {
        "rope_local_base_freq": 10000.0,
        "sliding_window_pattern": 6,
        "query_pre_attn_scalar": gemma_query_scale(meta, config, large_layers=62),
    }


def granite(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "logits_scaling": float(meta.get("logit_scale", 1.0)),
        "attention_multiplier": float(meta.get("attention.scale", 1.0)),
        "embedding_multiplier": float(meta.get("embedding_scale", 1.0)),
        "residual_multiplier": float(meta.get("residual_scale", 1.0)),
    }


def qwen3_moe(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {"decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True}


def stablelm(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "use_qkv_bias": config["attention_bias"],
        "partial_rotary_factor": config.get("partial_rotary_factor", 1.0),
        "qk_layernorm": meta.has_tensor("blk.0.attn_q_norm.weight"),
        "use_parallel_residual": not meta.has_tensor("blk.0.ffn_norm.weight"),
    }


def cohere(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "logit_scale": float(meta.get("logit_scale", 1.0)),
        "use_qk_norm": meta.has_tensor("blk.0.attn_q_norm.weight"),
        "layer_norm_bias": meta.has_tensor("output_norm.bias"),
    }


def cohere2(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    # llama.cpp fixes Cohere 2's pattern of 3 local layers, then one global.
    return cohere(meta, config) | {"sliding_window_pattern": 4}


def gpt_oss(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    # llama.cpp alternates sliding-window and full attention layers, the first sliding.
    layers = layer_pattern(
        config["num_hidden_layers"], 2, local="sliding_attention", full="full_attention"
    )
    return {"layer_types": layers}


def glm4(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {"partial_rotary_factor": config.get("partial_rotary_factor", 0.5)}


def olmoe(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {"norm_topk_prob": bool(meta.get("expert_weights_norm", False))}


def seed_oss(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {"attention_out_bias": meta.has_tensor("blk.0.attn_output.bias")}


def ernie4_5(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {"use_bias": config["attention_bias"]}


def exaone4(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    # The converter stores the pattern as one flag per layer, true for sliding-window
    # layers; mlx-lm reads it as a string of L (local) and G (global) repeated.
    pattern = meta.get("attention.sliding_window_pattern")
    scaling = {"rope_scaling": config.get("rope_scaling")}
    if config.get("sliding_window") is None or not isinstance(pattern, list):
        return scaling | {"sliding_window": None, "sliding_window_pattern": None}
    return scaling | {"sliding_window_pattern": "".join("L" if local else "G" for local in pattern)}


def hunyuan_dense(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    # The converter folds HunYuan's NTK alpha into the stored RoPE base.
    return {"use_qk_norm": meta.has_tensor("blk.0.attn_q_norm.weight"), "rope_scaling": None}


def routed_experts(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """The DeepSeek-style router keys (dots1, GLM-4.5): dense leading layers, shared
    experts, the routed weights' scale and normalization, expert groups."""
    return {
        "first_k_dense_replace": meta.get("leading_dense_block_count", 0),
        "n_shared_experts": meta.get("expert_shared_count", 0),
        "routed_scaling_factor": float(meta.get("expert_weights_scale", 1.0)),
        "norm_topk_prob": bool(meta.get("expert_weights_norm", False)),
        "n_group": meta.get("expert_group_count", 1),
        "topk_group": meta.get("expert_group_used_count", 1),
    }


def apertus(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "post_norm": False,
        "qk_norm": meta.has_tensor("blk.0.attn_q_norm.weight"),
        "mlp_bias": config["mlp_bias"],
        "attention_bias": config["attention_bias"],
    }


def apertus_xielu(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, mx.array]:
    """The per-layer xIELU constants, which the converter writes as `xielu.*` arrays."""
    weights = {}
    for name in ("alpha_p", "alpha_n", "beta", "eps"):
        values = meta.metadata.get(f"xielu.{name}")
        if not isinstance(values, list) or len(values) != config["num_hidden_layers"]:
            raise ModelLoadError(f"{meta.where} lacks one xielu.{name} value per layer")
        for layer, value in enumerate(values):
            weights[f"model.layers.{layer}.mlp.act_fn.{name}"] = mx.array(value, mx.float32)
    return weights


def plamo(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {"n_shared_head": config["num_attention_heads"] // config["num_key_value_heads"]}


def internlm2(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {"bias": config["attention_bias"]}


def mistral3_model_type(metadata: Mapping[str, Any]) -> str:
    """Ministral 3 (YaRN with Llama 4's attention temperature) or a Llama-shaped text model
    (Mistral Small 3.x)."""
    has_temperature = metadata.get("mistral3.attention.temperature_scale") is not None
    return "ministral3" if has_temperature else "llama"


def mistral3(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    if config["model_type"] != "ministral3":
        return {}
    scaling = config.get("rope_scaling") or {"rope_type": "default"}
    # The converter stores Ministral 3's mscale_all_dim itself as the YaRN log multiplier.
    mscale = float(meta.get("rope.scaling.yarn_log_multiplier", 1.0))
    parameters = scaling | {
        "rope_theta": config["rope_theta"],
        "mscale": mscale,
        "mscale_all_dim": mscale,
        "llama_4_scaling_beta": float(meta.required("attention.temperature_scale")),
        "original_max_position_embeddings": scaling.get(
            "original_max_position_embeddings", config["max_position_embeddings"]
        ),
    }
    return {"rope_parameters": parameters, "layer_types": None}


def glm4_moe(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return routed_experts(meta, config) | {
        "use_qk_norm": meta.has_tensor("blk.0.attn_q_norm.weight"),
        "partial_rotary_factor": config.get("partial_rotary_factor", 0.5),
        "rope_scaling": config.get("rope_scaling"),
    }


def deepseek(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "first_k_dense_replace": meta.get("leading_dense_block_count", 0),
        "n_shared_experts": meta.get("expert_shared_count") or None,
    }


def nemotron(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    # llama.cpp runs Nemotron's MLP with squared ReLU, which GGUF does not name.
    return {"hidden_act": "relu2"}


def minicpm(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """MiniCPM's scales, which the converter stores already combined: the residual scale
    divided by the layer count's square root, the logits' as hidden / dim_model_base."""
    layers = config["num_hidden_layers"]
    return {
        "scale_emb": float(meta.get("embedding_scale", 1.0)),
        "scale_depth": float(meta.get("residual_scale", 1.0)) * layers**0.5,
        "dim_model_base": round(config["hidden_size"] / float(meta.get("logit_scale", 1.0))),
    }


def hunyuan_moe(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    shared = meta.get("expert_shared_count", 0)
    return {
        "moe_topk": config["num_experts_per_tok"],
        "num_shared_expert": shared,
        "use_mixed_mlp_moe": shared > 0,
        "use_qk_norm": meta.has_tensor("blk.0.attn_q_norm.weight"),
        "use_cla": False,
        "cla_share_factor": 1,
        # The converter folds the NTK alpha into the stored RoPE base.
        "rope_scaling": {"type": "dynamic", "alpha": 1.0, "factor": 1.0},
    }


def ernie4_5_moe(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return ernie4_5(meta, config) | {
        "moe_num_experts": config["num_experts"],
        "moe_k": config["num_experts_per_tok"],
        "moe_intermediate_size": config["moe_intermediate_size"],
        "moe_layer_start_index": meta.get("leading_dense_block_count", 0),
        "moe_layer_interval": meta.get("interleave_moe_layer_step", 1),
        "moe_num_shared_experts": meta.get("expert_shared_count", 0),
    }


def gpt2(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """GPT-2's own names for the common sizes."""
    return {
        "n_embd": config["hidden_size"],
        "n_head": config["num_attention_heads"],
        "n_layer": config["num_hidden_layers"],
        "n_ctx": config["max_position_embeddings"],
        "n_positions": config["max_position_embeddings"],
    }


def gpt_bigcode(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return gpt2(meta, config) | {
        "n_inner": config["intermediate_size"],
        "multi_query": config["num_key_value_heads"] == 1,
        "attention_bias": meta.has_tensor("blk.0.attn_qkv.bias"),
        "mlp_bias": config["mlp_bias"],
    }


def gpt_neox(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "rotary_pct": config.get("partial_rotary_factor", 1.0),
        "rotary_emb_base": config["rope_theta"],
        "use_parallel_residual": bool(meta.get("use_parallel_residual", True)),
    }


def exaone_moe(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    layers = config["num_hidden_layers"]
    dense = meta.get("leading_dense_block_count", 0)
    pattern = meta.get("attention.sliding_window_pattern")
    sliding = config.get("sliding_window") is not None and isinstance(pattern, list)
    return routed_experts(meta, config) | {
        "num_shared_experts": meta.get("expert_shared_count", 0),
        "is_moe_layer": [layer >= dense for layer in range(layers)],
        "layer_types": [
            "sliding_attention" if sliding and pattern[layer] else "full_attention"
            for layer in range(layers)
        ],
        "sliding_window": config.get("sliding_window", 0),
        "rope_scaling": config.get("rope_scaling"),
    }


def qwen(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """Qwen (1)'s names; its feed-forward length counts both halves of the gated MLP."""
    return {
        "kv_channels": config["head_dim"],
        "no_bias": not meta.has_tensor("blk.0.attn_output.bias"),
    }


def bailing_moe(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    # The converter stores the output head already normalized (`norm_head`).
    return routed_experts(meta, config) | {
        "num_shared_experts": meta.get("expert_shared_count", 0),
        "use_qkv_bias": meta.has_tensor("blk.0.attn_q.bias"),
        "use_bias": meta.has_tensor("blk.0.attn_output.bias"),
        "norm_head": False,
    }


# gguf.ExpertGatingFuncType values.
_SOFTMAX_GATING = 1
_SIGMOID_GATING = 2


def bailing_moe2(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """Ling 2.0: QK norm, a sigmoid router with the aux-loss-free expert bias and expert
    groups; the shared expert's width is `expert_shared_feed_forward_length` per shared
    expert, as llama.cpp sizes it."""
    leading = meta.get("leading_dense_block_count", 0)
    shared_ffn = meta.get("expert_shared_feed_forward_length")
    return routed_experts(meta, config) | {
        "num_shared_experts": meta.get("expert_shared_count", 0),
        "moe_shared_expert_intermediate_size": None if shared_ffn is None else int(shared_ffn),
        "use_qkv_bias": meta.has_tensor("blk.0.attn_qkv.bias"),
        "use_bias": meta.has_tensor("blk.0.attn_output.bias"),
        "use_qk_norm": meta.has_tensor("blk.0.attn_q_norm.weight"),
        "moe_router_enable_expert_bias": meta.has_tensor(f"blk.{leading}.exp_probs_b.bias"),
        "score_function": (
            "sigmoid" if meta.get("expert_gating_func") == _SIGMOID_GATING else "softmax"
        ),
        "norm_head": False,
    }


def afmoe(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """AFMoE (Trinity). llama.cpp fixes what GGUF does not store: 3 sliding-window layers
    with RoPE to 1 global layer without, and the embeddings scaled by sqrt(hidden) (µP);
    the router is sigmoid unless the file says otherwise. A file without a window runs the
    same layers over the whole context."""
    gating = meta.get("expert_gating_func")
    return {
        "layer_types": layer_pattern(
            config["num_hidden_layers"], 4, local="sliding_attention", full="full_attention"
        ),
        "sliding_window": config.get("sliding_window", config["max_position_embeddings"]),
        "mup_enabled": True,
        "num_dense_layers": meta.get("leading_dense_block_count", 0),
        "num_shared_experts": meta.get("expert_shared_count", 0),
        "route_norm": bool(meta.get("expert_weights_norm", False)),
        "route_scale": float(meta.get("expert_weights_scale", 1.0)),
        "score_func": "softmax" if gating == _SOFTMAX_GATING else "sigmoid",
        "n_group": meta.get("expert_group_count", 1),
        "topk_group": meta.get("expert_group_used_count", 1),
    }


def plamo3(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """PLaMo 3's local/global layers. Without a window every layer is global; the local
    RoPE base is `rope.freq_base_swa`, else llama.cpp's default of 10000 (PLaMo 3's own)."""
    window = meta.get("attention.sliding_window")
    if not window:
        return {"sliding_window_pattern": 1, "window_size": config["max_position_embeddings"]}
    return {
        "window_size": int(window),
        "sliding_window_pattern": int(meta.get("attention.sliding_window_pattern", 8)),
        "rope_local_theta": float(meta.get("rope.freq_base_swa", 10000.0)),
    }


# The offsets PLaMo 3's norms add at run time, which the converter adds to the stored
# weights (by GGUF name).
_PLAMO3_NORM_OFFSETS = {
    "attn_norm": 1.0,
    "post_attention_norm": 1.0 / 5,
    "ffn_norm": 1.0,
    "post_ffw_norm": 1.0 / 5**1.5,
    "attn_q_norm": 1.0,
    "attn_k_norm": 1.0,
    "output_norm": 1.0,
}


def subtract_plamo3_norm_offsets(
    base: str, arrays: dict[str, mx.array], config: dict[str, Any]
) -> dict[str, mx.array]:
    """Take off the offset the converter added to each of PLaMo 3's norm weights."""
    offset = _PLAMO3_NORM_OFFSETS.get(base)
    if offset is None:
        return arrays
    weight = arrays["weight"]
    return {"weight": (weight.astype(mx.float32) - offset).astype(weight.dtype)}


def minicpm3(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """MiniCPM 3's latent attention sizes, and the scales llama.cpp fixes for it (GGUF
    stores none): embeddings times 12, residuals times 1.4 / sqrt(layers), logits divided by
    hidden / 256. Its LongRoPE factors come as tensors."""
    rope_dims = meta.size("rope.dimension_count")
    return {
        "q_lora_rank": meta.get("attention.q_lora_rank"),
        "kv_lora_rank": meta.size("attention.kv_lora_rank"),
        "qk_rope_head_dim": rope_dims,
        "qk_nope_head_dim": config["head_dim"] - rope_dims,
        "scale_emb": 12.0,
        "scale_depth": 1.4,
        "dim_model_base": 256,
        "rope_scaling": {"original_max_position_embeddings": config["max_position_embeddings"]},
    }


def minimax(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "rotary_dim": meta.size("rope.dimension_count", config["head_dim"]),
        "shared_intermediate_size": 0,
        "use_qk_norm": meta.has_tensor("blk.0.attn_q_norm.weight"),
        "scoring_func": "sigmoid",
    }


def gptj(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return gpt2(meta, config) | {
        "rotary_dim": meta.size("rope.dimension_count", config["head_dim"]),
    }


def dbrx(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """DBRX's nested `ffn_config` and `attn_config`."""
    return {
        "d_model": config["hidden_size"],
        "n_layers": config["num_hidden_layers"],
        "n_heads": config["num_attention_heads"],
        "ffn_config": {
            "ffn_hidden_size": config["intermediate_size"],
            "moe_num_experts": config["num_experts"],
            "moe_top_k": config["num_experts_per_tok"],
        },
        "attn_config": {
            "kv_n_heads": config["num_key_value_heads"],
            "clip_qkv": float(meta.required("attention.clamp_kqv")),
            "rope_theta": config["rope_theta"],
        },
    }


def llama4(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """Llama 4's text model, nested as mlx-lm reads it. llama.cpp fixes what GGUF does not
    store: 8192-token attention chunks on three layers of four (the fourth global, without
    RoPE), the attention temperature (floor 8192, scale 0.1), and QK norm on every model
    but the 128-expert one (Maverick). Its Llama 3 RoPE scaling comes as `rope_freqs`.

    Raises:
        ModelLoadError: a file without chunked attention (`attention.sliding_window` 0,
            MobileLLM-style), which mlx-lm's Llama 4 does not run.
    """
    if meta.get("attention.sliding_window") == 0:
        raise ModelLoadError(
            f"{meta.where}: a Llama 4 without chunked attention (sliding_window 0) is not "
            "supported; mlx-lm's llama4 always chunks three layers of four"
        )
    experts = meta.size("expert_count")
    text = {
        "model_type": "llama4_text",
        "attention_bias": config["attention_bias"],
        "attention_chunk_size": 8192,
        "head_dim": config["head_dim"],
        "hidden_size": config["hidden_size"],
        "interleave_moe_layer_step": meta.size("interleave_moe_layer_step", 1),
        "intermediate_size": config["moe_intermediate_size"],
        "intermediate_size_mlp": config["intermediate_size"],
        "max_position_embeddings": config["max_position_embeddings"],
        "num_attention_heads": config["num_attention_heads"],
        "num_experts_per_tok": config["num_experts_per_tok"],
        "num_hidden_layers": config["num_hidden_layers"],
        "num_key_value_heads": config["num_key_value_heads"],
        "num_local_experts": experts,
        "rms_norm_eps": config["rms_norm_eps"],
        "rope_scaling": None,
        "rope_theta": config["rope_theta"],
        "use_qk_norm": experts != 128,
        "vocab_size": config["vocab_size"],
        "attn_temperature_tuning": 4,
        "floor_scale": 8192,
        "attn_scale": 0.1,
    }
    return {"text_config": text}


def install_llama4_rope_factors(
    module: nn.Module, factors: mx.array, config: dict[str, Any]
) -> None:
    """Llama 4's `rope_freqs` on the layers that use RoPE, rotating interleaved pairs."""
    for layer in module.layers:
        if layer.self_attn.use_rope:
            layer.self_attn.rope = FrequencyFactorRoPE(
                config["head_dim"], config["rope_theta"], factors, traditional=True
            )
