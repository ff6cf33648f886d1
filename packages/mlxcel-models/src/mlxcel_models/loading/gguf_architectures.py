"""The GGUF architectures mlxcel loads, each with the mlx-lm family that runs it and what
llama.cpp's converter (`convert_hf_to_gguf.py`) changed on the way to GGUF.

`GGUF_ARCHITECTURES` is the one table: detection maps `general.architecture` to an mlx-lm
`model_type` through it, and `metadata.family_for` asks `gguf_model_types()` which
families load from GGUF.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_config import (
    GGUFMetadata,
    common_config,
    gemma_query_scale,
    layer_pattern,
)
from mlxcel_models.loading.gguf_layouts import (
    INTERNLM2_WQKV,
    TensorJoin,
    interleave_neox_qkv,
    unshuffle_plamo_heads,
)
from mlxcel_models.loading.gguf_mla import LATENT_ATTENTION, deepseek_config, deepseek_model_type

ConfigExtras = Callable[[GGUFMetadata, dict[str, Any]], dict[str, Any]]
RestoreTensor = Callable[[str, dict[str, mx.array], dict[str, Any]], dict[str, mx.array]]
MetadataWeights = Callable[[GGUFMetadata, dict[str, Any]], dict[str, mx.array]]


def _none(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class GGUFArchitecture:
    """One `general.architecture` value and how it becomes an mlx-lm model.

    Attributes:
        name: the GGUF architecture name (`gguf.MODEL_ARCH_NAMES`).
        model_type: the mlx-lm `model_type` that runs it.
        moe_model_type: the `model_type` when the file has experts (`expert_count`):
            llama.cpp writes Mixtral as `llama`.
        rope_permuted: the converter permuted the Q/K rows for llama.cpp's interleaved
            RoPE (`LlamaModel.permute`); the loader permutes them back.
        norm_offset: added by the converter to every norm weight (Gemma stores `1 + w`),
            subtracted by the loader.
        name_aliases: (mlx-lm fragment, fragment gguf's `TensorNameMap` knows) pairs for
            parameter names mlx-lm spells differently from the Hugging Face checkpoint.
        extras: config keys beyond `common_config`, from the metadata and the common keys.
        select_model_type: picks the `model_type` from the metadata where one GGUF
            architecture covers several mlx-lm families (DeepSeek V2 and V3).
        other_model_types: the families `select_model_type` picks besides `model_type`.
        tensor_join: tensors of a layer the loader joins into parameters (`gguf_layouts`).
        restore_tensor: undoes a family's own layout change on one converted tensor,
            given its GGUF base name (`attn_q`), its arrays and the config.
        metadata_weights: parameters the converter moved into the metadata (Apertus's
            xIELU constants), as mlx-lm parameter path → array.
        dropped_tensors: tensors (name within a layer) the mlx-lm family discards when it
            loads the checkpoint, left out as it leaves them out.
    """

    name: str
    model_type: str
    moe_model_type: str | None = None
    rope_permuted: bool = False
    norm_offset: float = 0.0
    name_aliases: tuple[tuple[str, str], ...] = ()
    extras: ConfigExtras = field(default=_none)
    select_model_type: Callable[[Mapping[str, Any]], str] | None = None
    other_model_types: tuple[str, ...] = ()
    tensor_join: TensorJoin | None = None
    restore_tensor: RestoreTensor | None = None
    metadata_weights: MetadataWeights | None = None
    dropped_tensors: frozenset[str] = frozenset()

    def model_type_for(self, metadata: Mapping[str, Any]) -> str:
        """The mlx-lm `model_type` of a file with this architecture."""
        if self.select_model_type is not None:
            return self.select_model_type(metadata)
        if self.moe_model_type is not None and metadata.get(f"{self.name}.expert_count"):
            return self.moe_model_type
        return self.model_type

    def config(self, meta: GGUFMetadata) -> dict[str, Any]:
        """The Hugging Face-style config mlx-lm builds this family from."""
        config = common_config(meta)
        config["model_type"] = self.model_type_for(meta.metadata)
        return config | self.extras(meta, config)


# Mixture-of-experts layers: mlx-lm stacks the experts as `switch_mlp`, the converter as one
# merged tensor per projection, which TensorNameMap knows under `experts`.
_SWITCH = (("switch_mlp", "experts"),)
# mlx-lm's GPT-NeoX keeps its layers under `model.h`, Hugging Face's under `gpt_neox.layers`.
_GPT_NEOX_NAMES = (
    ("model.embed_out", "embed_out"),
    ("model.h.", "gpt_neox.layers."),
    ("model.", "gpt_neox."),
)


def _gemma2(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "attn_logit_softcapping": float(meta.get("attn_logit_softcapping", 50.0)),
        "final_logit_softcapping": float(meta.get("final_logit_softcapping", 30.0)),
        "query_pre_attn_scalar": gemma_query_scale(meta, config, large_layers=46),
    }


def _gemma3(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    # llama.cpp fixes Gemma 3's local RoPE base and its 5 local : 1 global layer pattern.
    return {
        "rope_local_base_freq": 10000.0,
        "sliding_window_pattern": 6,
        "query_pre_attn_scalar": gemma_query_scale(meta, config, large_layers=62),
    }


def _granite(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "logits_scaling": float(meta.get("logit_scale", 1.0)),
        "attention_multiplier": float(meta.get("attention.scale", 1.0)),
        "embedding_multiplier": float(meta.get("embedding_scale", 1.0)),
        "residual_multiplier": float(meta.get("residual_scale", 1.0)),
    }


def _qwen3_moe(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {"decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True}


def _stablelm(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "use_qkv_bias": config["attention_bias"],
        "partial_rotary_factor": config.get("partial_rotary_factor", 1.0),
        "qk_layernorm": meta.has_tensor("blk.0.attn_q_norm.weight"),
        "use_parallel_residual": not meta.has_tensor("blk.0.ffn_norm.weight"),
    }


def _cohere(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "logit_scale": float(meta.get("logit_scale", 1.0)),
        "use_qk_norm": meta.has_tensor("blk.0.attn_q_norm.weight"),
        "layer_norm_bias": meta.has_tensor("output_norm.bias"),
    }


def _cohere2(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    # llama.cpp fixes Cohere 2's pattern of 3 local layers, then one global.
    return _cohere(meta, config) | {"sliding_window_pattern": 4}


def _gpt_oss(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    # llama.cpp alternates sliding-window and full attention layers, the first sliding.
    layers = layer_pattern(
        config["num_hidden_layers"], 2, local="sliding_attention", full="full_attention"
    )
    return {"layer_types": layers}


def _glm4(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {"partial_rotary_factor": config.get("partial_rotary_factor", 0.5)}


def _olmoe(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {"norm_topk_prob": bool(meta.get("expert_weights_norm", False))}


def _seed_oss(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {"attention_out_bias": meta.has_tensor("blk.0.attn_output.bias")}


def _ernie4_5(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {"use_bias": config["attention_bias"]}


def _exaone4(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    # The converter stores the pattern as one flag per layer, true for sliding-window
    # layers; mlx-lm reads it as a string of L (local) and G (global) repeated.
    pattern = meta.get("attention.sliding_window_pattern")
    scaling = {"rope_scaling": config.get("rope_scaling")}
    if config.get("sliding_window") is None or not isinstance(pattern, list):
        return scaling | {"sliding_window": None, "sliding_window_pattern": None}
    return scaling | {"sliding_window_pattern": "".join("L" if local else "G" for local in pattern)}


def _hunyuan_dense(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    # The converter folds HunYuan's NTK alpha into the stored RoPE base.
    return {"use_qk_norm": meta.has_tensor("blk.0.attn_q_norm.weight"), "rope_scaling": None}


def _routed_experts(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
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


def _apertus(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "post_norm": False,
        "qk_norm": meta.has_tensor("blk.0.attn_q_norm.weight"),
        "mlp_bias": config["mlp_bias"],
        "attention_bias": config["attention_bias"],
    }


def _apertus_xielu(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, mx.array]:
    """The per-layer xIELU constants, which the converter writes as `xielu.*` arrays."""
    weights = {}
    for name in ("alpha_p", "alpha_n", "beta", "eps"):
        values = meta.metadata.get(f"xielu.{name}")
        if not isinstance(values, list) or len(values) != config["num_hidden_layers"]:
            raise ModelLoadError(f"{meta.where} lacks one xielu.{name} value per layer")
        for layer, value in enumerate(values):
            weights[f"model.layers.{layer}.mlp.act_fn.{name}"] = mx.array(value, mx.float32)
    return weights


def _plamo(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {"n_shared_head": config["num_attention_heads"] // config["num_key_value_heads"]}


def _internlm2(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {"bias": config["attention_bias"]}


def _mistral3_model_type(metadata: Mapping[str, Any]) -> str:
    """Ministral 3 (YaRN with Llama 4's attention temperature) or a Llama-shaped text model
    (Mistral Small 3.x)."""
    has_temperature = metadata.get("mistral3.attention.temperature_scale") is not None
    return "ministral3" if has_temperature else "llama"


def _mistral3(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
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


def _glm4_moe(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return _routed_experts(meta, config) | {
        "use_qk_norm": meta.has_tensor("blk.0.attn_q_norm.weight"),
        "partial_rotary_factor": config.get("partial_rotary_factor", 0.5),
        "rope_scaling": config.get("rope_scaling"),
    }


def _deepseek(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "first_k_dense_replace": meta.get("leading_dense_block_count", 0),
        "n_shared_experts": meta.get("expert_shared_count") or None,
    }


def _nemotron(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    # llama.cpp runs Nemotron's MLP with squared ReLU, which GGUF does not name.
    return {"hidden_act": "relu2"}


def _minicpm(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """MiniCPM's scales, which the converter stores already combined: the residual scale
    divided by the layer count's square root, the logits' as hidden / dim_model_base."""
    layers = config["num_hidden_layers"]
    return {
        "scale_emb": float(meta.get("embedding_scale", 1.0)),
        "scale_depth": float(meta.get("residual_scale", 1.0)) * layers**0.5,
        "dim_model_base": round(config["hidden_size"] / float(meta.get("logit_scale", 1.0))),
    }


def _hunyuan_moe(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
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


def _ernie4_5_moe(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return _ernie4_5(meta, config) | {
        "moe_num_experts": config["num_experts"],
        "moe_k": config["num_experts_per_tok"],
        "moe_intermediate_size": config["moe_intermediate_size"],
        "moe_layer_start_index": meta.get("leading_dense_block_count", 0),
        "moe_layer_interval": meta.get("interleave_moe_layer_step", 1),
        "moe_num_shared_experts": meta.get("expert_shared_count", 0),
    }


def _gpt2(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """GPT-2's own names for the common sizes."""
    return {
        "n_embd": config["hidden_size"],
        "n_head": config["num_attention_heads"],
        "n_layer": config["num_hidden_layers"],
        "n_ctx": config["max_position_embeddings"],
        "n_positions": config["max_position_embeddings"],
    }


def _gpt_bigcode(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return _gpt2(meta, config) | {
        "n_inner": config["intermediate_size"],
        "multi_query": config["num_key_value_heads"] == 1,
        "attention_bias": meta.has_tensor("blk.0.attn_qkv.bias"),
        "mlp_bias": config["mlp_bias"],
    }


def _gpt_neox(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "rotary_pct": config.get("partial_rotary_factor", 1.0),
        "rotary_emb_base": config["rope_theta"],
        "use_parallel_residual": bool(meta.get("use_parallel_residual", True)),
    }


def _exaone_moe(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    layers = config["num_hidden_layers"]
    dense = meta.get("leading_dense_block_count", 0)
    pattern = meta.get("attention.sliding_window_pattern")
    sliding = config.get("sliding_window") is not None and isinstance(pattern, list)
    return _routed_experts(meta, config) | {
        "num_shared_experts": meta.get("expert_shared_count", 0),
        "is_moe_layer": [layer >= dense for layer in range(layers)],
        "layer_types": [
            "sliding_attention" if sliding and pattern[layer] else "full_attention"
            for layer in range(layers)
        ],
        "sliding_window": config.get("sliding_window", 0),
        "rope_scaling": config.get("rope_scaling"),
    }


_ARCHITECTURES = (
    GGUFArchitecture(
        "llama",
        "llama",
        moe_model_type="mixtral",
        rope_permuted=True,
        name_aliases=(
            ("switch_mlp.gate_proj", "experts.w1"),
            ("switch_mlp.down_proj", "experts.w2"),
            ("switch_mlp.up_proj", "experts.w3"),
        ),
    ),
    GGUFArchitecture("qwen2", "qwen2"),
    GGUFArchitecture("qwen3", "qwen3"),
    GGUFArchitecture("qwen2moe", "qwen2_moe", name_aliases=_SWITCH),
    GGUFArchitecture("qwen3moe", "qwen3_moe", name_aliases=_SWITCH, extras=_qwen3_moe),
    GGUFArchitecture("gemma", "gemma", norm_offset=1.0),
    GGUFArchitecture("gemma2", "gemma2", norm_offset=1.0, extras=_gemma2),
    GGUFArchitecture("gemma3", "gemma3_text", norm_offset=1.0, extras=_gemma3),
    GGUFArchitecture("phi3", "phi3"),
    GGUFArchitecture("olmo2", "olmo2"),
    GGUFArchitecture("granite", "granite", rope_permuted=True, extras=_granite),
    # The converter splits Granite's fused expert `input_linear` into ffn_gate_exps and
    # ffn_up_exps, the GGUF names of stacked `mlp.experts` projections.
    GGUFArchitecture(
        "granitemoe",
        "granitemoe",
        rope_permuted=True,
        name_aliases=(("block_sparse_moe.switch_mlp", "mlp.experts"),),
        extras=_granite,
    ),
    GGUFArchitecture("glm4", "glm4", extras=_glm4),
    GGUFArchitecture("gpt-oss", "gpt_oss", extras=_gpt_oss),
    GGUFArchitecture("starcoder2", "starcoder2"),
    GGUFArchitecture("stablelm", "stablelm", extras=_stablelm),
    GGUFArchitecture("exaone", "exaone"),
    GGUFArchitecture("command-r", "cohere", extras=_cohere),
    GGUFArchitecture("cohere2", "cohere2", extras=_cohere2),
    GGUFArchitecture("smollm3", "smollm3", rope_permuted=True),
    GGUFArchitecture("phi2", "phi"),
    GGUFArchitecture("olmoe", "olmoe", name_aliases=_SWITCH, extras=_olmoe),
    GGUFArchitecture("seed_oss", "seed_oss", extras=_seed_oss),
    GGUFArchitecture("ernie4_5", "ernie4_5", extras=_ernie4_5),
    GGUFArchitecture("exaone4", "exaone4", extras=_exaone4),
    GGUFArchitecture(
        "exaone-moe",
        "exaone_moe",
        name_aliases=(*_SWITCH, ("e_score_correction_bias", "e_score_correction.bias")),
        extras=_exaone_moe,
    ),
    # mlx-lm's ERNIE 4.5 MoE routes without the aux-loss-free expert bias.
    GGUFArchitecture(
        "ernie4_5-moe",
        "ernie4_5_moe",
        name_aliases=_SWITCH,
        extras=_ernie4_5_moe,
        dropped_tensors=frozenset({"exp_probs_b.bias"}),
    ),
    GGUFArchitecture("gpt2", "gpt2", name_aliases=(("model.", "transformer."),), extras=_gpt2),
    GGUFArchitecture("starcoder", "gpt_bigcode", extras=_gpt_bigcode),
    GGUFArchitecture(
        "gptneox",
        "gpt_neox",
        name_aliases=_GPT_NEOX_NAMES,
        extras=_gpt_neox,
        restore_tensor=interleave_neox_qkv,
    ),
    GGUFArchitecture("hunyuan-dense", "hunyuan_v1_dense", extras=_hunyuan_dense),
    GGUFArchitecture("hunyuan-moe", "hunyuan", name_aliases=_SWITCH, extras=_hunyuan_moe),
    GGUFArchitecture(
        "dots1",
        "dots1",
        name_aliases=(*_SWITCH, ("e_score_correction_bias", "e_score_correction.bias")),
        extras=_routed_experts,
    ),
    GGUFArchitecture("apertus", "apertus", extras=_apertus, metadata_weights=_apertus_xielu),
    GGUFArchitecture("plamo", "plamo", extras=_plamo, restore_tensor=unshuffle_plamo_heads),
    GGUFArchitecture(
        "deepseek", "deepseek", rope_permuted=True, name_aliases=_SWITCH, extras=_deepseek
    ),
    GGUFArchitecture("nemotron", "nemotron", norm_offset=1.0, extras=_nemotron),
    GGUFArchitecture("minicpm", "minicpm", rope_permuted=True, extras=_minicpm),
    GGUFArchitecture(
        "glm4moe",
        "glm4_moe",
        name_aliases=(*_SWITCH, ("e_score_correction_bias", "e_score_correction.bias")),
        extras=_glm4_moe,
    ),
    GGUFArchitecture(
        "mistral3",
        "llama",
        rope_permuted=True,
        extras=_mistral3,
        select_model_type=_mistral3_model_type,
        other_model_types=("ministral3",),
    ),
    # The converter splits InternLM 2's fused `wqkv` into attn_q / attn_k / attn_v.
    GGUFArchitecture(
        "internlm2",
        "internlm2",
        extras=_internlm2,
        tensor_join=INTERNLM2_WQKV,
    ),
    GGUFArchitecture(
        "deepseek2",
        "deepseek_v2",
        other_model_types=("deepseek_v3",),
        # The converter renames the router's `e_score_correction_bias` to a bias.
        name_aliases=(*_SWITCH, ("e_score_correction_bias", "e_score_correction.bias")),
        extras=deepseek_config,
        select_model_type=deepseek_model_type,
        tensor_join=LATENT_ATTENTION,
    ),
)
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
