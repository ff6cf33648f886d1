"""Tiny Gemma 4 and Gemma 3n models written as llama.cpp's converter writes them.

Gemma 4 (`Gemma4Model`, mlx-lm `gemma4_text`): the global layers' head size and KV heads
under their own keys, double-wide MLP widths as an array, the proportional RoPE as
`rope_freqs` factors, fused gate/up experts, the router's scales renamed, and the K/V
projections the layers sharing an earlier layer's cache still carry in the checkpoint.
Gemma 3n (`Gemma3NModel`, mlx-lm `gemma3n`): the AltUp projections stacked, the activation
sparsity as normal quantiles.
"""

from __future__ import annotations

from statistics import NormalDist
from typing import Any

import numpy as np

from gguf_models import VOCAB_SIZE, ConvertedFamily, tiny_config

_SLIDING, _FULL = "sliding_attention", "full_attention"
_GLOBAL_HEAD_DIM = 32
_GLOBAL_ROTARY = 0.25
_ROPE_PARAMETERS = {
    _FULL: {
        "partial_rotary_factor": _GLOBAL_ROTARY,
        "rope_theta": 1_000_000.0,
        "rope_type": "proportional",
    },
    _SLIDING: {"partial_rotary_factor": 1.0, "rope_theta": 5000.0, "rope_type": "default"},
}


def convert_gemma4(config: dict[str, Any]):
    """The converter's changes to a Gemma 4 checkpoint (mlx-lm names) for `config`."""

    def merge(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(1)
        layers = config["num_hidden_layers"]
        first_shared = layers - config["num_kv_shared_layers"]
        converted = {}
        for name, weight in weights.items():
            parts = name.split(".")
            if name.endswith(".layer_scalar"):
                converted[f"blk.{parts[2]}.layer_output_scale.weight"] = weight
            elif name.endswith(".router.scale"):
                converted[f"blk.{parts[2]}.ffn_gate_inp.scale"] = weight
            elif name.endswith(".router.per_expert_scale"):
                converted[f"blk.{parts[2]}.ffn_down_exps.scale"] = weight
            elif ".experts.switch_glu.up_proj." in name:
                continue
            elif ".experts.switch_glu.gate_proj." in name:
                up = weights[name.replace("gate_proj", "up_proj")]
                fused = name.replace("switch_glu.gate_proj", "gate_up_proj")
                converted[fused] = np.concatenate([weight, up], axis=-2)
            elif ".experts.switch_glu.down_proj." in name:
                converted[name.replace("switch_glu.down_proj", "down_proj")] = weight
            else:
                converted[name] = weight
        # The checkpoint still holds K/V for the layers reading an earlier layer's cache.
        for layer in range(first_shared, layers):
            prefix = f"model.layers.{layer}.self_attn"
            head_dim = converted[f"{prefix}.q_norm.weight"].shape[0]
            kv_rows = config["num_key_value_heads"] * head_dim
            for part in ("k_proj", "v_proj"):
                converted[f"{prefix}.{part}.weight"] = rng.standard_normal(
                    (kv_rows, config["hidden_size"])
                ).astype(np.float32)
            converted[f"{prefix}.k_norm.weight"] = np.ones(head_dim, np.float32)
        rotated = int(_GLOBAL_HEAD_DIM * _GLOBAL_ROTARY / 2)
        factors = [1.0] * rotated + [1e30] * (_GLOBAL_HEAD_DIM // 2 - rotated)
        converted["rope_freqs.weight"] = np.array(factors, np.float32)
        return converted

    return merge


def gemma4_metadata(config: dict[str, Any], kv_heads: list[int] | None = None) -> dict[str, Any]:
    """The `gemma4.*` keys `Gemma4Model.set_gguf_parameters` writes for `config`."""
    layers = config["num_hidden_layers"]
    first_shared = layers - config["num_kv_shared_layers"]
    width = config["intermediate_size"]
    metadata = {
        "layer_norm_rms_eps": config["rms_norm_eps"],
        "key_length": _GLOBAL_HEAD_DIM,
        "value_length": _GLOBAL_HEAD_DIM,
        "key_length_swa": config["head_dim"],
        "value_length_swa": config["head_dim"],
        "rope_dimension_count": _GLOBAL_HEAD_DIM,
        "rope_dimension_count_swa": config["head_dim"],
        "rope_freq_base": _ROPE_PARAMETERS[_FULL]["rope_theta"],
        "rope_freq_base_swa": _ROPE_PARAMETERS[_SLIDING]["rope_theta"],
        "sliding_window": config["sliding_window"],
        "sliding_window_pattern": [kind == _SLIDING for kind in config["layer_types"]],
        "shared_kv_layers": config["num_kv_shared_layers"],
        "embedding_length_per_layer_input": config["hidden_size_per_layer_input"],
        "final_logit_softcapping": config["final_logit_softcapping"],
        "feed_forward_length": [
            width * (2 if layer >= first_shared else 1) for layer in range(layers)
        ],
    }
    if kv_heads is not None:
        metadata["head_count_kv"] = kv_heads
    if config.get("enable_moe_block"):
        metadata |= {
            "expert_count": config["num_experts"],
            "expert_used_count": config["top_k_experts"],
            "expert_feed_forward_length": config["moe_intermediate_size"],
        }
    return metadata


# E2B-like: per-layer inputs, the last two layers reading the first two's caches with
# double-wide MLPs, a window shorter than the prompt.
_DENSE = tiny_config(
    "gemma4_text",
    num_hidden_layers=4,
    layer_types=[_SLIDING, _FULL] * 2,
    sliding_window=6,
    global_head_dim=_GLOBAL_HEAD_DIM,
    num_kv_shared_layers=2,
    use_double_wide_mlp=True,
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=VOCAB_SIZE,
    final_logit_softcapping=30.0,
    rope_parameters=_ROPE_PARAMETERS,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
# 26B-A4B-like: experts beside the dense MLP, global layers whose keys are their values
# with KV heads of their own, no per-layer inputs.
_EXPERTS = tiny_config(
    "gemma4_text",
    num_hidden_layers=2,
    layer_types=[_SLIDING, _FULL],
    sliding_window=6,
    global_head_dim=_GLOBAL_HEAD_DIM,
    num_kv_shared_layers=0,
    hidden_size_per_layer_input=0,
    attention_k_eq_v=True,
    num_global_key_value_heads=1,
    enable_moe_block=True,
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=32,
    final_logit_softcapping=30.0,
    rope_parameters=_ROPE_PARAMETERS,
    rms_norm_eps=1e-6,
)

GEMMA_FAMILIES = {
    "gemma4_text": ConvertedFamily(
        "gemma4", _DENSE, gemma4_metadata(_DENSE), merge_tensors=convert_gemma4(_DENSE)
    ),
    "gemma4_text_experts": ConvertedFamily(
        "gemma4",
        _EXPERTS,
        gemma4_metadata(_EXPERTS, kv_heads=[2, 1]),
        merge_tensors=convert_gemma4(_EXPERTS),
    ),
}


def stack_altup_projections(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Gemma 3n's AltUp projections stacked into one tensor each, and the AltUp output
    scale named as a weight, as `Gemma3NModel` writes them."""
    prefix = "model.language_model"
    converted = {}
    for name, weight in weights.items():
        if ".altup_projections." in name or ".altup_unembed_projections." in name:
            continue
        suffix = ".weight" if name.endswith(".correct_output_scale") else ""
        converted[name + suffix] = weight
    for kind in ("altup_projections", "altup_unembed_projections"):
        count = len([name for name in weights if f".{kind}." in name])
        stacked = [weights[f"{prefix}.{kind}.{index}.weight"] for index in range(count)]
        converted[f"{prefix}.{kind}.weight"] = np.stack(stacked)
    return converted


_GEMMA3N_TEXT = tiny_config(
    "gemma3n_text",
    num_hidden_layers=4,
    layer_types=[_SLIDING, _FULL] * 2,
    sliding_window=6,
    num_kv_shared_layers=2,
    vocab_size_per_layer_input=VOCAB_SIZE,
    rope_theta=1_000_000.0,
    rope_local_base_freq=5000.0,
    final_logit_softcapping=30.0,
    activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0],
    hidden_size_per_layer_input=8,
    altup_num_inputs=4,
    altup_coef_clip=120.0,
    altup_correct_scale=True,
    altup_active_idx=0,
    # llama.cpp requires a LAuReL rank of 64.
    laurel_rank=64,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
# The test writer reads the decoder sizes at the top level; mlx-lm's gemma3n reads text_config.
_GEMMA3N = _GEMMA3N_TEXT | {"model_type": "gemma3n", "text_config": _GEMMA3N_TEXT}
_GEMMA3N_METADATA = {
    "layer_norm_rms_eps": 1e-6,
    "rope_freq_base_swa": 5000.0,
    "sliding_window": 6,
    "sliding_window_pattern": [kind == _SLIDING for kind in _GEMMA3N_TEXT["layer_types"]],
    "shared_kv_layers": 2,
    "embedding_length_per_layer_input": 8,
    "altup_active_idx": 0,
    "altup_num_inputs": 4,
    "final_logit_softcapping": 30.0,
    # torch's Normal(0, 1).icdf, -inf for p = 0.
    "activation_sparsity_scale": [
        NormalDist().inv_cdf(p) if p > 0 else float("-inf")
        for p in _GEMMA3N_TEXT["activation_sparsity_pattern"]
    ],
}

GEMMA_FAMILIES["gemma3n"] = ConvertedFamily(
    "gemma3n",
    _GEMMA3N,
    _GEMMA3N_METADATA,
    name_aliases=(("model.language_model.", "model."),),
    merge_tensors=stack_altup_projections,
)
