"""GGUF architectures `qwen35` and `qwen35moe` (Qwen3.5, dense and mixture-of-experts), which
load into mlx-lm's `qwen3_5` and `qwen3_5_moe`.

Qwen3.5 is Qwen3-Next's hybrid (gated-delta layers, full attention every
`full_attention_interval`-th layer) with separate `in_proj_qkv`, `in_proj_z`, `in_proj_a`
and `in_proj_b` projections, every layer's MLP an expert layer in the MoE model, and
interleaved MRoPE (`rope.dimension_sections`). On text every token's position is the same
along the MRoPE axes, so the rotation is plain half-split RoPE; the sections are kept in
the config as the checkpoint's `mrope_section`.

llama.cpp's converter (`_LinearAttentionVReorderBase`) reorders the value heads of the
gated-delta layers, where a key head has several, from grouped per key head
(`k0v0, k0v1, k1v0, k1v1`) to tiled (`k0v0, k1v0, k0v1, k1v1`), so ggml can broadcast the key
heads without an interleaved repeat. It does so in the value rows of `attn_qkv` and of the
convolution kernel, the rows of `attn_gate` (z), `ssm_alpha` and `ssm_beta`, the vectors
`ssm_a` and `ssm_dt`, and the input columns of `ssm_out`; the loader puts them back.
Multi-token-prediction layers it appends (`nextn_predict_layers`) are left out. With
`--fuse-gate-up-exps` the MoE model's expert gate and up projections come as one
`ffn_gate_up_exps` (gate rows first), split back in their packing.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_architecture import GGUFArchitecture
from mlxcel_models.loading.gguf_config import GGUFMetadata
from mlxcel_models.loading.gguf_hybrid import hybrid_base_config, qwen3_next
from mlxcel_models.loading.gguf_layouts import SHARED_EXPERT_GATE
from mlxcel_models.loading.gguf_recurrent import SSM_RESHAPED, restore_ssm_decay

# mlx-lm keeps the text model under `language_model`; the converter names the value heads'
# time-step bias as a projection's bias, and the stacked experts `experts`.
_QWEN35_NAMES = (
    ("language_model.", ""),
    ("switch_mlp", "experts"),
    ("linear_attn.dt_bias", "linear_attn.dt_proj.bias"),
)
# llama.cpp's quantizer drops the size-one axis of the shared expert's gate (the converter
# writes it (1, hidden)), as it writes every tensor with its trailing ones dropped.
_QWEN35_RESHAPED = SSM_RESHAPED | SHARED_EXPERT_GATE
# GGUF base name → (the axis holding the value heads, whether the queries' and keys' rows
# come first on it).
_TILED = {
    "attn_qkv": (0, True),
    "ssm_conv1d": (0, True),
    "attn_gate": (0, False),
    "ssm_alpha": (0, False),
    "ssm_beta": (0, False),
    "ssm_a": (0, False),
    "ssm_dt": (0, False),
    "ssm_out": (-1, False),
}


def qwen3_5(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """Qwen3.5's gated-delta sizes (stored as Qwen3-Next's), its layer pattern and RoPE.

    mlx-lm reads RoPE from `rope_parameters` only (its defaults would override
    `rope_theta`), so the base, the rotated fraction (`rope.dimension_count` over the head
    size; all of it when absent, as llama.cpp rotates) and any scaling go there. llama.cpp
    normalizes the top-k expert weights of the MoE model unconditionally.

    Raises:
        ModelLoadError: the value heads do not group over the key heads, or the file's
            per-layer recurrent flags (`attention.recurrent_layers`) are not the pattern
            of its `full_attention_interval`.
    """
    extras = qwen3_next(meta, config)
    value_heads, key_heads = extras["linear_num_value_heads"], extras["linear_num_key_heads"]
    if value_heads % key_heads:
        raise ModelLoadError(
            f"{meta.where}: {meta.architecture}.ssm.time_step_rank ({value_heads}) must be a "
            f"multiple of {meta.architecture}.ssm.group_count ({key_heads})"
        )
    _check_recurrent_layers(meta, config, extras["full_attention_interval"])
    rope: dict[str, Any] = {"type": "default"} | (config.get("rope_scaling") or {})
    rope |= {
        "rope_theta": config["rope_theta"],
        "partial_rotary_factor": config.get("partial_rotary_factor", 1.0),
    }
    sections = meta.get("rope.dimension_sections")
    if isinstance(sections, list):
        rope |= {"mrope_section": [int(s) for s in sections[:3]], "mrope_interleaved": True}
    del extras["mlp_only_layers"], extras["rope_scaling"]
    return extras | {"norm_topk_prob": True, "rope_parameters": rope}


def _check_recurrent_layers(meta: GGUFMetadata, config: dict[str, Any], interval: int) -> None:
    """Refuse per-layer recurrent flags that mlx-lm's fixed interval cannot express."""
    flags = meta.get("attention.recurrent_layers")
    if flags is None:
        return
    num_layers = config["num_hidden_layers"]
    expected = [(i + 1) % interval != 0 for i in range(num_layers)]
    if [bool(flag) for flag in list(flags)[:num_layers]] != expected:
        raise ModelLoadError(
            f"{meta.where}: {meta.architecture}.attention.recurrent_layers is not one full "
            f"attention layer every {interval} (full_attention_interval), as mlx-lm's "
            f"{config['model_type']} lays them out"
        )


def untile_value_heads(
    base: str, arrays: dict[str, mx.array], config: dict[str, Any]
) -> dict[str, mx.array]:
    """Undo the converter's grouped-to-tiled reorder of the gated-delta value heads in one
    tensor (and take `A_log` back from the stored decay). Works on packed quantized rows;
    `ssm_out`'s columns only where a value head spans whole quantization groups.

    Raises:
        ModelLoadError: `ssm_out`'s packed columns do not split into value heads, or the
            decay is not negative.
    """
    arrays = restore_ssm_decay(base, arrays, config)
    key_heads, value_heads = config["linear_num_key_heads"], config["linear_num_value_heads"]
    if base not in _TILED or key_heads == value_heads:
        return arrays
    axis, after_qk = _TILED[base]
    if axis == -1 and any(value.shape[-1] % value_heads for value in arrays.values()):
        raise ModelLoadError(
            f"{base}: the value heads' columns ({config['linear_value_head_dim']} each) are "
            "not whole quantization groups, so their order cannot be restored"
        )
    skip = 2 * key_heads * config["linear_key_head_dim"] if after_qk else 0
    per_key = value_heads // key_heads
    return {key: _untile(value, axis, skip, key_heads, per_key) for key, value in arrays.items()}


def _untile(value: mx.array, axis: int, skip: int, key_heads: int, per_key: int) -> mx.array:
    """`value` with the heads along `axis` (after its first `skip` rows) put back from
    (per_key, key_heads) to (key_heads, per_key) order. Quantized rows keep their packing:
    a head's rows move whole."""
    if axis == -1:
        tiled = value.reshape(*value.shape[:-1], per_key, key_heads, -1)
        return tiled.swapaxes(-3, -2).reshape(value.shape)
    heads = value[skip:]
    tiled = heads.reshape(per_key, key_heads, -1, *heads.shape[1:])
    grouped = tiled.swapaxes(0, 1).reshape(heads.shape)
    return mx.concatenate([value[:skip], grouped]) if skip else grouped


def route_fused_experts(name: str, config: dict[str, Any]) -> tuple[str, ...] | None:
    """`switch_mlp`'s gate and up projections for the fused `ffn_gate_up_exps` (experts,
    2 * ffn, hidden) that `--fuse-gate-up-exps` writes; None (gguf-py's table) otherwise."""
    if not name.startswith("blk.") or not name.endswith(".ffn_gate_up_exps.weight"):
        return None
    experts = f"language_model.model.layers.{name.split('.')[1]}.mlp.switch_mlp"
    return (f"{experts}.gate_proj.weight", f"{experts}.up_proj.weight")


QWEN35_ARCHITECTURES = (
    GGUFArchitecture(
        "qwen35",
        "qwen3_5",
        name_aliases=_QWEN35_NAMES,
        base_config=hybrid_base_config,
        extras=qwen3_5,
        restore_tensor=untile_value_heads,
        reshaped_tensors=_QWEN35_RESHAPED,
    ),
    GGUFArchitecture(
        "qwen35moe",
        "qwen3_5_moe",
        name_aliases=_QWEN35_NAMES,
        base_config=hybrid_base_config,
        extras=qwen3_5,
        restore_tensor=untile_value_heads,
        reshaped_tensors=_QWEN35_RESHAPED,
        route_tensor=route_fused_experts,
    ),
)
