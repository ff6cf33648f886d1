"""GLM-5's sparse attention (`glm-dsa`) and Mistral 4 (`mistral4`) in GGUF files: both are
written through DeepSeek V2's converter path (`gguf_mla`), each with what it adds.

GLM-5 (`GlmMoeDsaModel`) adds the sparse-attention indexer: its head count, head size and
top-k as `attention.indexer.*`, its tensors as `indexer.*`. llama.cpp runs every layer's
indexer ("full": it ranks the keys itself) unless `attention.indexer.types` says
otherwise; without that key, a training context of 2^20 tokens or more marks GLM-5.2, whose
layers mostly reuse an earlier layer's top-k ("shared"). mlx-lm's `glm_moe_dsa` has an
indexer in every layer, so only files whose layers are all full load.

Mistral 4 (`Mistral3Model.Mistral4Model`) keeps its experts' fused `gate_up_proj`
(`ffn_gate_up_exps`, gate rows first), as the converter's `--fuse-gate-up-exps` writes
other families' experts; the loader splits it for mlx-lm's `switch_mlp` in both.
That path does not store the Llama 4 query temperature (`llama_4_scaling_beta`): llama.cpp
reads it from `attention.temperature_scale` (which Mistral's own-format converter writes for
its DeepSeek V2-style models) and, without it, scales no query; the loader does the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mlx.core as mx

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_config import GGUFMetadata
from mlxcel_models.loading.gguf_layouts import TensorJoin
from mlxcel_models.loading.gguf_mla import (
    LATENT_ATTENTION,
    deepseek_config,
    latent_attention_weights,
)

# gguf.ExpertGatingFuncType values.
_SOFTMAX_GATING = 1
_SIGMOID_GATING = 2
# llama.cpp's GLM-DSA loader takes a file without `attention.indexer.types` whose training
# context is at least this long for GLM-5.2, with its shared-indexer layers.
_GLM_5_2_CONTEXT = 1 << 20
_GATE_UP_EXPERTS = "ffn_gate_up_exps.weight"


def glm_dsa_config(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """`glm_moe_dsa`'s keys: DeepSeek's MLA sizes (`deepseek_config`), the indexer's sizes,
    the sigmoid router, and `rope_parameters`, from which the family reads its RoPE.

    Raises:
        ModelLoadError: the router is not sigmoid-gated, or a layer's indexer is shared.
    """
    gating = meta.get("expert_gating_func", _SIGMOID_GATING)
    if gating != _SIGMOID_GATING:
        raise ModelLoadError(
            f"{meta.where}: glm-dsa.expert_gating_func is {gating}; mlx-lm's glm_moe_dsa "
            f"routes experts by sigmoid scores only ({_SIGMOID_GATING})"
        )
    _check_full_indexers(meta, config)
    extras = deepseek_config(meta, config)
    scaling = extras.get("rope_scaling") or {"rope_type": "default"}
    return extras | {
        "index_n_heads": meta.size("attention.indexer.head_count"),
        "index_head_dim": meta.size("attention.indexer.key_length"),
        "index_topk": meta.size("attention.indexer.top_k"),
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        # llama.cpp runs experts in every layer after the leading dense ones, and ropes the
        # indexer's heads as the attention's, pairs interleaved (LLAMA_ROPE_TYPE_NORM).
        "moe_layer_freq": 1,
        "indexer_rope_interleave": True,
        "rope_parameters": scaling | {"rope_theta": config["rope_theta"]},
    }


def _check_full_indexers(meta: GGUFMetadata, config: Mapping[str, Any]) -> None:
    kinds = meta.get("attention.indexer.types")
    if kinds is None:
        if config["max_position_embeddings"] >= _GLM_5_2_CONTEXT:
            raise ModelLoadError(
                f"{meta.where}: a glm-dsa file without glm-dsa.attention.indexer.types and a "
                f"{config['max_position_embeddings']}-token context is GLM-5.2, whose layers "
                "mostly reuse an earlier layer's indexer; mlx-lm's glm_moe_dsa gives every "
                "layer its own"
            )
        return
    shared = [layer for layer, kind in enumerate(kinds) if kind not in (True, 1, "full")]
    if shared:
        raise ModelLoadError(
            f"{meta.where}: glm-dsa layers {shared} reuse an earlier layer's indexer "
            "(glm-dsa.attention.indexer.types); mlx-lm's glm_moe_dsa gives every layer its own"
        )


def mistral4_config(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """`mistral4`'s keys: DeepSeek's MLA sizes and router (`deepseek_config`) and
    `rope_parameters` holding the RoPE (YaRN where the file has it) and the Llama 4 query
    temperature: `attention.temperature_scale`, 0 (no temperature, as llama.cpp runs a file
    without it) where the file has none.

    Raises:
        ModelLoadError: the router is not softmax-gated, or the temperature's length differs
            from YaRN's original context, which mlx-lm reads as one value.
    """
    gating = meta.get("expert_gating_func", _SOFTMAX_GATING)
    if gating != _SOFTMAX_GATING:
        raise ModelLoadError(
            f"{meta.where}: mistral4.expert_gating_func is {gating}; mlx-lm's mistral4 "
            f"routes experts by softmax scores only ({_SOFTMAX_GATING})"
        )
    extras = deepseek_config(meta, config)
    scaling = extras.get("rope_scaling") or {}
    beta = float(meta.get("attention.temperature_scale", 0.0))
    length = meta.get("attention.temperature_length")
    original = scaling.get("original_max_position_embeddings")
    if beta and length is not None and original is not None and int(length) != original:
        raise ModelLoadError(
            f"{meta.where}: mistral4.attention.temperature_length ({length}) differs from "
            f"mistral4.rope.scaling.original_context_length ({original}); mlx-lm's mistral4 "
            "reads both as rope_parameters' original_max_position_embeddings"
        )
    original = original or length or config["max_position_embeddings"]
    return extras | {
        "rope_parameters": scaling
        | {
            "rope_theta": config["rope_theta"],
            "llama_4_scaling_beta": beta,
            "original_max_position_embeddings": int(original),
        }
    }


def latent_layer_weights(
    tensors: Mapping[str, mx.array], config: Mapping[str, Any]
) -> dict[str, mx.array] | None:
    """A latent-attention layer's joined parameters once the parts read so far are
    complete: the latent attention's `kv_b` halves (`latent_attention_weights`) and fused
    experts' `ffn_gate_up_exps` (experts, 2 * ffn, hidden) split into `switch_mlp`'s gate
    and up projections; None while a half of the `kv_b` pair is still to come."""
    latent = {name: value for name, value in tensors.items() if name != _GATE_UP_EXPERTS}
    weights: dict[str, mx.array] = {}
    if latent:
        attention = latent_attention_weights(latent, config)
        if attention is None:
            return None
        weights |= attention
    if _GATE_UP_EXPERTS in tensors:
        gate, up = mx.split(tensors[_GATE_UP_EXPERTS], 2, axis=1)
        weights |= {"mlp.switch_mlp.gate_proj.weight": gate, "mlp.switch_mlp.up_proj.weight": up}
    return weights or None


LATENT_AND_FUSED_EXPERTS = TensorJoin(
    LATENT_ATTENTION.names | {_GATE_UP_EXPERTS}, latent_layer_weights
)
