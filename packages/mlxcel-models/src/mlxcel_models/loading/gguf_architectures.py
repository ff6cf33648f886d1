"""The GGUF architectures mlxcel loads, each with the mlx-lm family that runs it and what
llama.cpp's converter (`convert_hf_to_gguf.py`) changed on the way to GGUF.

`GGUF_ARCHITECTURES` is the one table: detection maps `general.architecture` to an mlx-lm
`model_type` through it, and `metadata.family_for` asks `gguf_model_types()` which
families load from GGUF.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mlxcel_models.loading import gguf_family_configs as configs
from mlxcel_models.loading.gguf_architecture import GGUFArchitecture
from mlxcel_models.loading.gguf_gemma import GEMMA_ARCHITECTURES
from mlxcel_models.loading.gguf_hybrid import (
    GATED_DELTA_IN_PROJ,
    GRANITE_SHARED_INPUT,
    granite_hybrid,
    hybrid_base_config,
    jamba,
    lfm2,
    lfm2_moe,
    nemotron_h,
    nemotron_h_expert_names,
    qwen3_next,
)
from mlxcel_models.loading.gguf_layered import (
    OPENELM_PROJ_1,
    install_rope_factors_where_rotated,
    layered_base_config,
    nemotron_nas,
    openelm,
    unpermute_nas_rope_rows,
)
from mlxcel_models.loading.gguf_layouts import (
    BAILING_QUERY_KEY_VALUE,
    DBRX_EXPERTS,
    INTERNLM2_WQKV,
    SHARED_EXPERT_GATE,
    interleave_neox_qkv,
    unpermute_xverse_rows,
    unshuffle_plamo_heads,
)
from mlxcel_models.loading.gguf_mla import LATENT_ATTENTION, deepseek_config, deepseek_model_type
from mlxcel_models.loading.gguf_mla_group import MLA_GROUP_ARCHITECTURES
from mlxcel_models.loading.gguf_more_architectures import MORE_ARCHITECTURES
from mlxcel_models.loading.gguf_qwen35 import QWEN35_ARCHITECTURES
from mlxcel_models.loading.gguf_recurrent import (
    SSM_RESHAPED,
    falcon_h1,
    mamba,
    mamba2,
    restore_ssm_decay,
    ssm_base_config,
)
from mlxcel_models.loading.gguf_rwkv import (
    RWKV7_NAMES,
    RWKV7_PLACEHOLDERS,
    RWKV7_RESHAPED,
    RWKV7_TOKEN_SHIFT,
    rwkv7,
)

# Mixture-of-experts layers: mlx-lm stacks the experts as `switch_mlp`, the converter as one
# merged tensor per projection, which TensorNameMap knows under `experts`.
_SWITCH = (("switch_mlp", "experts"),)
# The converter renames DeepSeek-style routers' `e_score_correction_bias` to a bias.
_EXPERT_BIAS = ("e_score_correction_bias", "e_score_correction.bias")
# Mamba 2's time-step bias, which the converter names as a projection's.
_DT_BIAS = ("mixer.dt_bias", "mixer.dt_proj.bias")
# Mixtral's experts name their projections w1 (gate), w2 (down) and w3 (up).
_MIXTRAL_EXPERTS = (
    ("switch_mlp.gate_proj", "experts.w1"),
    ("switch_mlp.down_proj", "experts.w2"),
    ("switch_mlp.up_proj", "experts.w3"),
)
# mlx-lm's GPT-NeoX keeps its layers under `model.h`, Hugging Face's under `gpt_neox.layers`.
_GPT_NEOX_NAMES = (
    ("model.embed_out", "embed_out"),
    ("model.h.", "gpt_neox.layers."),
    ("model.", "gpt_neox."),
)


_ARCHITECTURES = (
    GGUFArchitecture(
        "llama",
        "llama",
        moe_model_type="mixtral",
        rope_permuted=True,
        name_aliases=_MIXTRAL_EXPERTS,
    ),
    GGUFArchitecture("qwen2", "qwen2"),
    GGUFArchitecture("qwen3", "qwen3"),
    GGUFArchitecture(
        "qwen2moe", "qwen2_moe", name_aliases=_SWITCH, reshaped_tensors=SHARED_EXPERT_GATE
    ),
    GGUFArchitecture("qwen3moe", "qwen3_moe", name_aliases=_SWITCH, extras=configs.qwen3_moe),
    GGUFArchitecture("gemma", "gemma", norm_offset=1.0),
    GGUFArchitecture("gemma2", "gemma2", norm_offset=1.0, extras=configs.gemma2),
    GGUFArchitecture("gemma3", "gemma3_text", norm_offset=1.0, extras=configs.gemma3),
    GGUFArchitecture("phi3", "phi3"),
    GGUFArchitecture("olmo2", "olmo2"),
    GGUFArchitecture("granite", "granite", rope_permuted=True, extras=configs.granite),
    # The converter splits Granite's fused expert `input_linear` into ffn_gate_exps and
    # ffn_up_exps, the GGUF names of stacked `mlp.experts` projections.
    GGUFArchitecture(
        "granitemoe",
        "granitemoe",
        rope_permuted=True,
        name_aliases=(("block_sparse_moe.switch_mlp", "mlp.experts"),),
        extras=configs.granite,
    ),
    GGUFArchitecture("glm4", "glm4", extras=configs.glm4),
    GGUFArchitecture("gpt-oss", "gpt_oss", extras=configs.gpt_oss),
    GGUFArchitecture("starcoder2", "starcoder2"),
    GGUFArchitecture("stablelm", "stablelm", extras=configs.stablelm),
    GGUFArchitecture("exaone", "exaone"),
    GGUFArchitecture("command-r", "cohere", extras=configs.cohere),
    GGUFArchitecture("cohere2", "cohere2", extras=configs.cohere2),
    GGUFArchitecture("smollm3", "smollm3", rope_permuted=True),
    GGUFArchitecture("phi2", "phi"),
    GGUFArchitecture("olmoe", "olmoe", name_aliases=_SWITCH, extras=configs.olmoe),
    GGUFArchitecture("seed_oss", "seed_oss", extras=configs.seed_oss),
    GGUFArchitecture("ernie4_5", "ernie4_5", extras=configs.ernie4_5),
    GGUFArchitecture("exaone4", "exaone4", extras=configs.exaone4),
    GGUFArchitecture(
        "exaone-moe",
        "exaone_moe",
        name_aliases=(*_SWITCH, _EXPERT_BIAS),
        extras=configs.exaone_moe,
    ),
    # mlx-lm's ERNIE 4.5 MoE routes without the aux-loss-free expert bias.
    GGUFArchitecture(
        "ernie4_5-moe",
        "ernie4_5_moe",
        name_aliases=_SWITCH,
        extras=configs.ernie4_5_moe,
        dropped_tensors=frozenset({"exp_probs_b.bias"}),
    ),
    GGUFArchitecture(
        "gpt2", "gpt2", name_aliases=(("model.", "transformer."),), extras=configs.gpt2
    ),
    GGUFArchitecture(
        "qwen", "qwen", name_aliases=(("model.", "transformer."),), extras=configs.qwen
    ),
    GGUFArchitecture(
        "gptj", "gptj", name_aliases=(("model.", "transformer."),), extras=configs.gptj
    ),
    GGUFArchitecture("starcoder", "gpt_bigcode", extras=configs.gpt_bigcode),
    GGUFArchitecture(
        "gptneox",
        "gpt_neox",
        name_aliases=_GPT_NEOX_NAMES,
        extras=configs.gpt_neox,
        restore_tensor=interleave_neox_qkv,
    ),
    # The converter splits Ling's fused `query_key_value` into attn_q / attn_k / attn_v.
    GGUFArchitecture(
        "bailingmoe",
        "bailing_moe",
        name_aliases=(*_SWITCH, ("gate.gate_proj", "gate")),
        extras=configs.bailing_moe,
        tensor_join=BAILING_QUERY_KEY_VALUE,
    ),
    # Ling 2.0 keeps the fused `query_key_value` (attn_qkv); the converter renames the
    # router's `expert_bias` to a bias (`exp_probs_b`).
    GGUFArchitecture(
        "bailingmoe2",
        "bailing_moe",
        name_aliases=(
            *_SWITCH,
            ("gate.gate_proj", "gate"),
            ("gate.expert_bias", "gate.expert_bias.bias"),
        ),
        extras=configs.bailing_moe2,
    ),
    # AFMoE (Trinity): the converter renames the router's `expert_bias` to a bias.
    GGUFArchitecture(
        "afmoe",
        "afmoe",
        name_aliases=(("mlp.expert_bias", "mlp.expert_bias.bias"),),
        extras=configs.afmoe,
    ),
    # PLaMo 3 keeps its fused qkv_proj (attn_qkv) and gate_up_proj (ffn_up); the converter
    # adds each norm's run-time offset to its weight.
    GGUFArchitecture(
        "plamo3",
        "plamo3",
        extras=configs.plamo3,
        restore_tensor=configs.subtract_plamo3_norm_offsets,
    ),
    GGUFArchitecture("xverse", "llama", restore_tensor=unpermute_xverse_rows),
    GGUFArchitecture("hunyuan-dense", "hunyuan_v1_dense", extras=configs.hunyuan_dense),
    GGUFArchitecture("hunyuan-moe", "hunyuan", name_aliases=_SWITCH, extras=configs.hunyuan_moe),
    GGUFArchitecture(
        "dots1",
        "dots1",
        name_aliases=(*_SWITCH, _EXPERT_BIAS),
        extras=configs.routed_experts,
    ),
    GGUFArchitecture(
        "apertus", "apertus", extras=configs.apertus, metadata_weights=configs.apertus_xielu
    ),
    GGUFArchitecture("plamo", "plamo", extras=configs.plamo, restore_tensor=unshuffle_plamo_heads),
    GGUFArchitecture(
        "deepseek", "deepseek", rope_permuted=True, name_aliases=_SWITCH, extras=configs.deepseek
    ),
    GGUFArchitecture("minicpm3", "minicpm3", extras=configs.minicpm3),
    GGUFArchitecture(
        "minimax-m2",
        "minimax",
        name_aliases=(*_MIXTRAL_EXPERTS, _EXPERT_BIAS),
        extras=configs.minimax,
    ),
    GGUFArchitecture("nemotron", "nemotron", norm_offset=1.0, extras=configs.nemotron),
    GGUFArchitecture("minicpm", "minicpm", rope_permuted=True, extras=configs.minicpm),
    GGUFArchitecture(
        "glm4moe",
        "glm4_moe",
        name_aliases=(*_SWITCH, _EXPERT_BIAS),
        extras=configs.glm4_moe,
    ),
    GGUFArchitecture(
        "mistral3",
        "llama",
        rope_permuted=True,
        extras=configs.mistral3,
        select_model_type=configs.mistral3_model_type,
        other_model_types=("ministral3",),
    ),
    # The converter splits InternLM 2's fused `wqkv` into attn_q / attn_k / attn_v.
    GGUFArchitecture(
        "internlm2",
        "internlm2",
        extras=configs.internlm2,
        tensor_join=INTERNLM2_WQKV,
    ),
    GGUFArchitecture(
        "deepseek2",
        "deepseek_v2",
        other_model_types=("deepseek_v3",),
        name_aliases=(*_SWITCH, _EXPERT_BIAS),
        extras=deepseek_config,
        select_model_type=deepseek_model_type,
        tensor_join=LATENT_ATTENTION,
    ),
)
# State-space models: no attention heads, `A` stored as the decay, reshaped tensors.
_ARCHITECTURES += (
    GGUFArchitecture(
        "mamba",
        "mamba",
        base_config=ssm_base_config,
        extras=mamba,
        restore_tensor=restore_ssm_decay,
        reshaped_tensors=SSM_RESHAPED,
    ),
    # The converter renames Mamba 2's `dt_bias` to the bias of a time-step projection.
    GGUFArchitecture(
        "mamba2",
        "mamba2",
        name_aliases=(_DT_BIAS,),
        base_config=ssm_base_config,
        extras=mamba2,
        restore_tensor=restore_ssm_decay,
        reshaped_tensors=SSM_RESHAPED,
    ),
    GGUFArchitecture(
        "falcon-h1",
        "falcon_h1",
        name_aliases=(("mamba.dt_bias", "mamba.dt_proj.bias"),),
        extras=falcon_h1,
        restore_tensor=restore_ssm_decay,
        reshaped_tensors=SSM_RESHAPED,
    ),
    GGUFArchitecture(
        "jamba",
        "jamba",
        name_aliases=(("feed_forward.switch_mlp", "mlp.experts"),),
        base_config=hybrid_base_config,
        extras=jamba,
        restore_tensor=restore_ssm_decay,
        reshaped_tensors=SSM_RESHAPED,
    ),
    # The converter permutes the attention layers' Q/K rows as for llama, although
    # Nemotron-H's attention has no RoPE.
    GGUFArchitecture(
        "nemotron_h",
        "nemotron_h",
        rope_permuted=True,
        name_aliases=(_DT_BIAS,),
        base_config=hybrid_base_config,
        extras=nemotron_h,
        restore_tensor=restore_ssm_decay,
        reshaped_tensors=SSM_RESHAPED,
    ),
    GGUFArchitecture(
        "nemotron_h_moe",
        "nemotron_h",
        rope_permuted=True,
        name_aliases=(_DT_BIAS, ("gate.e_score_correction_bias", "gate.e_score_correction.bias")),
        rename_parameter=nemotron_h_expert_names,
        base_config=hybrid_base_config,
        extras=nemotron_h,
        restore_tensor=restore_ssm_decay,
        reshaped_tensors=SSM_RESHAPED,
    ),
    GGUFArchitecture(
        "granitehybrid",
        "granitemoehybrid",
        rope_permuted=True,
        name_aliases=(
            ("block_sparse_moe.switch_mlp", "mlp.experts"),
            ("mamba.dt_bias", "mamba.dt_proj.bias"),
        ),
        base_config=hybrid_base_config,
        extras=granite_hybrid,
        tensor_join=GRANITE_SHARED_INPUT,
        restore_tensor=restore_ssm_decay,
        reshaped_tensors=SSM_RESHAPED,
    ),
    # The converter squeezes LFM2's short-convolution kernel (`shortconv.conv`) to 2-D.
    GGUFArchitecture(
        "lfm2",
        "lfm2",
        base_config=hybrid_base_config,
        extras=lfm2,
        reshaped_tensors=frozenset({"conv"}),
    ),
    # The converter renames LFM2-MoE's `expert_bias` to a bias (`exp_probs_b`).
    GGUFArchitecture(
        "lfm2moe",
        "lfm2_moe",
        name_aliases=(
            ("feed_forward.switch_mlp", "feed_forward.experts"),
            ("feed_forward.expert_bias", "feed_forward.expert_bias.bias"),
        ),
        base_config=hybrid_base_config,
        extras=lfm2_moe,
        reshaped_tensors=frozenset({"conv"}),
    ),
    # The converter splits Qwen3-Next's `in_proj_qkvz` (grouped per key head) into
    # attn_qkv and attn_gate.
    GGUFArchitecture(
        "qwen3next",
        "qwen3_next",
        name_aliases=(*_SWITCH, ("linear_attn.dt_bias", "linear_attn.dt_proj.bias")),
        base_config=hybrid_base_config,
        extras=qwen3_next,
        tensor_join=GATED_DELTA_IN_PROJ,
        restore_tensor=restore_ssm_decay,
        reshaped_tensors=SSM_RESHAPED | SHARED_EXPERT_GATE,
    ),
    GGUFArchitecture(
        "rwkv7",
        "rwkv7",
        name_aliases=RWKV7_NAMES,
        base_config=ssm_base_config,
        extras=rwkv7,
        tensor_join=RWKV7_TOKEN_SHIFT,
        dropped_tensors=RWKV7_PLACEHOLDERS,
        reshaped_tensors=RWKV7_RESHAPED,
    ),
)
# mlx-lm's DBRX keeps one MLP per expert; the converter stacks them. Llama 4's text model
# sits under `language_model` in mlx-lm; the converter does not permute its Q/K rows.
_ARCHITECTURES += (
    GGUFArchitecture("dbrx", "dbrx", extras=configs.dbrx, tensor_join=DBRX_EXPERTS),
    GGUFArchitecture(
        "llama4",
        "llama4",
        name_aliases=(("language_model.", ""),),
        extras=configs.llama4,
        install_rope_factors=configs.install_llama4_rope_factors,
    ),
)
# Layers of different sizes, written as per-layer arrays. The converter splits OpenELM's
# fused feed-forward input `proj_1` into ffn_gate and ffn_up.
_ARCHITECTURES += (
    GGUFArchitecture(
        "openelm",
        "openelm",
        base_config=layered_base_config,
        extras=openelm,
        tensor_join=OPENELM_PROJ_1,
    ),
    # A Nemotron-NAS layer's attention may be one linear map (`linear_attn`, which gguf-py
    # names as the attention output) or none; its Q/K rows are permuted per layer.
    GGUFArchitecture(
        "deci",
        "nemotron-nas",
        name_aliases=(("self_attn.linear.", "self_attn.linear_attn."),),
        base_config=hybrid_base_config,
        extras=nemotron_nas,
        restore_tensor=unpermute_nas_rope_rows,
        install_rope_factors=install_rope_factors_where_rotated,
    ),
)
_ARCHITECTURES += MORE_ARCHITECTURES
_ARCHITECTURES += MLA_GROUP_ARCHITECTURES
_ARCHITECTURES += GEMMA_ARCHITECTURES
_ARCHITECTURES += QWEN35_ARCHITECTURES
GGUF_ARCHITECTURES: dict[str, GGUFArchitecture] = {arch.name: arch for arch in _ARCHITECTURES}


def gguf_model_types() -> frozenset[str]:
    """The mlx-lm `model_type`s mlxcel loads from GGUF files."""
    return frozenset(
        model_type
        for arch in _ARCHITECTURES
        for model_type in (arch.model_type, arch.moe_model_type, *arch.other_model_types)
        if model_type is not None
    )


def gguf_model_type(architecture: str, metadata: Mapping[str, Any]) -> str:
    """The mlx-lm `model_type` of a GGUF file; an unknown architecture is returned as it
    is, for the family lookup to refuse by name."""
    arch = GGUF_ARCHITECTURES.get(architecture)
    return architecture if arch is None else arch.model_type_for(metadata)
