"""Gemma 3n GGUF files as mlx-lm's `gemma3n` (its language model).

llama.cpp's converter (`Gemma3NModel`, `conversion/gemma.py`) stores the norms as they are,
stacks the three AltUp projections and the three unembedding projections into one 3-D
tensor each (`altup_proj`, `altup_unembd_proj`, outside the layers), pads both embeddings
with zero rows to the full vocabulary (the vision and audio tokens), and writes the
activation sparsity as normal quantiles: Φ⁻¹(p) per layer (`activation_sparsity_scale`),
-inf for p = 0. It does not store the AltUp coefficient clip, the LAuReL rank or the
per-layer vocabulary: llama.cpp's graph (`src/models/gemma3n.cpp`) runs the coefficients
unclipped, requires a LAuReL rank of 64 and indexes the per-layer embedding with the
token id, so the padded rows give zeros.
"""

from __future__ import annotations

import math
from typing import Any

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_architecture import GGUFArchitecture
from mlxcel_models.loading.gguf_config import GGUFMetadata, common_config
from mlxcel_models.loading.gguf_hybrid import per_layer

SLIDING, FULL = "sliding_attention", "full_attention"
# llama.cpp's `rope_freq_base_train_swa` when the file has no `rope.freq_base_swa`.
DEFAULT_SLIDING_ROPE_BASE = 10000.0
# What llama.cpp fixes where the file is silent (`llama_model_gemma3n`, `llama_hparams`).
_LAUREL_RANK = 64
_KV_LAYERS = 20
_SPARSE_LAYERS, _SPARSITY = 10, 0.95
_DEFAULT_SOFTCAP = 30.0
_LANGUAGE_MODEL = "model.language_model"


def sliding_layers(meta: GGUFMetadata) -> list[bool]:
    """`attention.sliding_window_pattern`: per layer, whether it is a sliding one.

    Raises:
        ModelLoadError: the key is missing or not one boolean per layer.
    """
    pattern = meta.required("attention.sliding_window_pattern")
    layers = meta.size("block_count")
    if not isinstance(pattern, list) or len(pattern) != layers:
        raise ModelLoadError(
            f"{meta.where}: {meta.architecture}.attention.sliding_window_pattern must hold "
            f"one boolean per layer ({layers}), got {pattern!r}"
        )
    return [bool(value) for value in pattern]


def gemma3n_base_config(meta: GGUFMetadata) -> dict[str, Any]:
    """`common_config` with the first layer's feed-forward width (the TextConfig keeps
    the per-layer list, set in `gemma3n`)."""
    metadata = dict(meta.metadata)
    widths = per_layer(meta, "feed_forward_length")
    metadata[f"{meta.architecture}.feed_forward_length"] = widths[0]
    scalars = GGUFMetadata(metadata, meta.tensor_names, meta.architecture, where=meta.where)
    return common_config(scalars)


def gemma3n(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3n's `text_config`: layer kinds, KV sharing, AltUp, LAuReL, per-layer inputs
    and the activation sparsity turned back from normal quantiles into probabilities.

    Raises:
        ModelLoadError: the sparsity array or sliding pattern is not one value per layer,
            or the tied token embedding is not used as the LM head (`output.weight`).
    """
    num_layers = config["num_hidden_layers"]
    if meta.has_tensor("output.weight"):
        raise ModelLoadError(
            f"{meta.where}: Gemma 3n has a separate output.weight; mlx-lm's gemma3n ties the "
            "LM head to the token embedding"
        )
    widths = per_layer(meta, "feed_forward_length")[:num_layers]
    text_config = {
        key: config[key]
        for key in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rms_norm_eps",
            "vocab_size",
            "max_position_embeddings",
            "rope_theta",
        )
    } | {
        "model_type": "gemma3n_text",
        "intermediate_size": widths if len(set(widths)) > 1 else widths[0],
        "num_kv_shared_layers": int(
            meta.get("attention.shared_kv_layers", max(num_layers - _KV_LAYERS, 0))
        ),
        # llama.cpp sizes the per-layer embedding by the (padded) vocabulary.
        "vocab_size_per_layer_input": config["vocab_size"],
        "sliding_window": meta.size("attention.sliding_window"),
        "rope_local_base_freq": float(meta.get("rope.freq_base_swa", DEFAULT_SLIDING_ROPE_BASE)),
        "final_logit_softcapping": float(meta.get("final_logit_softcapping", _DEFAULT_SOFTCAP)),
        "layer_types": [
            SLIDING if is_sliding else FULL for is_sliding in sliding_layers(meta)[:num_layers]
        ],
        "activation_sparsity_pattern": _sparsity(meta, num_layers),
        "hidden_size_per_layer_input": meta.size("embedding_length_per_layer_input"),
        "altup_num_inputs": meta.size("altup.num_inputs", 4),
        "altup_coef_clip": None,
        "altup_correct_scale": meta.has_tensor("blk.0.altup_correct_scale.weight"),
        "altup_active_idx": int(meta.get("altup.active_idx", 0)),
        "laurel_rank": _LAUREL_RANK,
    }
    return {"text_config": text_config, "tie_word_embeddings": True}


def _sparsity(meta: GGUFMetadata, num_layers: int) -> list[float]:
    """Each layer's activation sparsity p from the stored Φ⁻¹(p), or llama.cpp's fixed
    0.95 on the first 10 layers when the file has none."""
    scales = meta.get("activation_sparsity_scale")
    if scales is None:
        return [_SPARSITY if layer < _SPARSE_LAYERS else 0.0 for layer in range(num_layers)]
    if not isinstance(scales, list) or len(scales) < num_layers:
        raise ModelLoadError(
            f"{meta.where}: {meta.architecture}.activation_sparsity_scale must hold one value "
            f"per layer ({num_layers}), got {scales!r}"
        )
    return [0.5 * math.erfc(-float(scale) / math.sqrt(2)) for scale in scales[:num_layers]]


def route_gemma3n_tensor(name: str, config: dict[str, Any]) -> tuple[str, ...] | None:
    """The AltUp projections the converter stacks into one tensor, one per index."""
    kinds = {"altup_proj.weight": "altup_projections"}
    kinds["altup_unembd_proj.weight"] = "altup_unembed_projections"
    kind = kinds.get(name)
    if kind is None:
        return None
    count = config["text_config"]["altup_num_inputs"] - 1
    return tuple(f"{_LANGUAGE_MODEL}.{kind}.{index}.weight" for index in range(count))


GEMMA3N = GGUFArchitecture(
    "gemma3n",
    "gemma3n",
    name_aliases=((f"{_LANGUAGE_MODEL}.", "model."),),
    base_config=gemma3n_base_config,
    extras=gemma3n,
    route_tensor=route_gemma3n_tensor,
)
