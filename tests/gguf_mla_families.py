"""Tiny mlx-lm families written as llama.cpp's converter writes them: GLM-5's sparse
attention (`glm-dsa`) and Mistral 4 (both through DeepSeek V2's converter path), and BitNet's
ternary matrices, beside `gguf_latent_families.LATENT_FAMILIES`."""

from __future__ import annotations

import re

import gguf
import numpy as np

from gguf_models import ConvertedFamily, tiny_config

# mlx-lm's absorbed latent attention holds the converter's split `kv_b_proj` halves.
_ABSORBED_KV_B = (("embed_q", "k_b_proj"), ("unembed_out", "v_b_proj"))
_SWITCH = ("switch_mlp", "experts")

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
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
}
# What DeepSeek V2's converter path writes for _MLA: multi-query attention over the latent.
_MLA_KEYS = {
    "layer_norm_rms_eps": 1e-5,
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
    "expert_group_count": 1,
    "expert_group_used_count": 1,
    "expert_weights_scale": 2.5,
    "expert_weights_norm": True,
}
# Mistral 4's YaRN, and a short original context so that the Llama 4 query temperature
# (1 + beta log(1 + floor(position / 8))) changes within the test's 22 positions.
_YARN = {
    "type": "yarn",
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 8,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
_YARN_KEYS = {
    "rope_scaling_type": gguf.RopeScalingType.YARN,
    "rope_scaling_factor": 4.0,
    "rope_scaling_orig_ctx_len": 8,
    "rope_scaling_yarn_beta_fast": 32.0,
    "rope_scaling_yarn_beta_slow": 1.0,
    "rope_scaling_yarn_log_mul": 0.1,
}


_GLM_CONFIG = tiny_config(
    "glm_moe_dsa",
    **_MLA,
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    moe_layer_freq=1,
    index_n_heads=2,
    index_head_dim=16,
    # Fewer than the test's positions, so the indexer's top-k selects keys.
    index_topk=4,
    attention_bias=False,
    rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
)
_GLM_KEYS = _MLA_KEYS | {
    "expert_gating_func": gguf.ExpertGatingFuncType.SIGMOID,
    "indexer_head_count": 2,
    "indexer_key_length": 16,
    "indexer_top_k": 4,
}
_GLM_NAMES = (_SWITCH, *_ABSORBED_KV_B, ("e_score_correction_bias", "e_score_correction.bias"))


def _mistral4_config(beta: float) -> dict:
    rope = _YARN | {"rope_theta": 10000.0, "llama_4_scaling_beta": beta}
    return tiny_config("mistral4", **_MLA, rope_parameters=rope)


def fuse_gate_up_experts(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Mistral 4's checkpoint layout: each layer's expert gate and up projections as one
    (experts, 2 * ffn, hidden) `gate_up_proj`, gate rows first."""
    fused = dict(weights)
    for name in [name for name in weights if name.endswith("switch_mlp.gate_proj.weight")]:
        up = name.replace("gate_proj", "up_proj")
        fused[name.replace("gate_proj", "gate_up_proj")] = np.concatenate(
            [fused.pop(name), fused.pop(up)], axis=1
        )
    return fused


def fuse_gate_up_experts_by_gguf_name(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The converter's `--fuse-gate-up-exps`: `fuse_gate_up_experts`, written under the GGUF
    name (`blk.N.ffn_gate_up_exps.weight`), which this gguf-py names for Mistral 4 only."""
    return {
        re.sub(
            r"^model\.layers\.(\d+)\.mlp\.switch_mlp\.gate_up_proj\.",
            r"blk.\1.ffn_gate_up_exps.",
            name,
        ): value
        for name, value in fuse_gate_up_experts(weights).items()
    }


def unpack_bitlinear(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What `BitnetModel.weight_quant` writes for each BitLinear layer: its ternary matrix
    times its scale, as floats (0 or ±scale), from mlx-lm's packed codes and scale."""
    dense = {}
    for name, value in weights.items():
        if name.endswith(".weight_scale"):
            continue
        if value.dtype == np.uint8:
            ternary = np.concatenate([((value >> (2 * i)) & 3).astype(np.float32) - 1
                                      for i in range(4)])  # fmt: skip
            value = ternary * weights[re.sub(r"weight$", "weight_scale", name)][0]
        dense[name] = value
    return dense


MLA_GROUP_FAMILIES = {
    "glm_moe_dsa": ConvertedFamily("glm-dsa", _GLM_CONFIG, _GLM_KEYS, name_aliases=_GLM_NAMES),
    "glm_moe_dsa_fused_experts": ConvertedFamily(
        "glm-dsa",
        _GLM_CONFIG,
        _GLM_KEYS,
        name_aliases=_GLM_NAMES,
        merge_tensors=fuse_gate_up_experts_by_gguf_name,
    ),
    # The converter's file, with the query temperature llama.cpp reads for DeepSeek V2-style
    # files (`attention.temperature_scale`, which Mistral's own-format converter writes).
    "mistral4": ConvertedFamily(
        "mistral4",
        _mistral4_config(beta=0.1),
        _MLA_KEYS | _YARN_KEYS | {"attn_temperature_scale": 0.1, "attn_temperature_length": 8},
        name_aliases=(_SWITCH, *_ABSORBED_KV_B),
        merge_tensors=fuse_gate_up_experts,
    ),
    # As the Hugging Face converter writes it, without the temperature: none is applied.
    "mistral4_without_temperature": ConvertedFamily(
        "mistral4",
        _mistral4_config(beta=0.0),
        _MLA_KEYS | _YARN_KEYS,
        name_aliases=(_SWITCH, *_ABSORBED_KV_B),
        merge_tensors=fuse_gate_up_experts,
    ),
    "bitnet": ConvertedFamily(
        "bitnet",
        tiny_config("bitnet", tie_word_embeddings=True),
        {
            "layer_norm_rms_eps": 1e-5,
            "rope_scaling_type": gguf.RopeScalingType.LINEAR,
            "rope_scaling_factor": 1.0,
            "hidden_activation": "relu2",
        },
        name_aliases=(
            ("self_attn.attn_sub_norm", "self_attn.inner_attn_ln"),
            ("mlp.ffn_sub_norm", "mlp.ffn_layernorm"),
        ),
        merge_tensors=unpack_bitlinear,
    ),
}
