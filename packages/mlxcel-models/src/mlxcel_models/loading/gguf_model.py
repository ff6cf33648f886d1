"""Building an mlx-lm model from a GGUF file: hyperparameters, tensor names, Q/K layout."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.dimensions import check_head_counts, positive_int
from mlxcel_models.metadata import FamilyMetadata
from mlxcel_models.rope import FrequencyFactorRoPE

_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
ROPE_FACTORS_TENSOR = "rope_freqs.weight"
_TENSOR_NAME = re.compile(r"^(?:blk\.(\d+)\.)?([a-z_]+)\.(weight|bias|scales|biases)$")


def gguf_model_config(
    metadata: dict[str, Any],
    tensor_names: set[str],
    family: FamilyMetadata,
    *,
    where: str | Path = "GGUF metadata",
) -> dict[str, Any]:
    """A Hugging Face-style config for mlx-lm's model class, from GGUF metadata.

    Args:
        metadata: the GGUF key/value metadata.
        tensor_names: the names of the file's tensors.
        family: the family `general.architecture` names.
        where: the file the metadata comes from, for error messages.

    Raises:
        ModelLoadError: a required hyperparameter is missing, a count or size is not a
            positive integer, or the query heads do not group over the KV heads.
    """
    arch = family.model_type

    def required(key: str) -> Any:
        value = metadata.get(f"{arch}.{key}")
        if value is None:
            raise ModelLoadError(f"{where} lacks {arch}.{key}")
        return value

    def size(key: str, default: int | None = None) -> int:
        value = required(key) if default is None else metadata.get(f"{arch}.{key}", default)
        return positive_int(value, f"{arch}.{key}", where)

    num_heads = size("attention.head_count")
    num_kv_heads = size("attention.head_count_kv", num_heads)
    check_head_counts(
        num_heads,
        num_kv_heads,
        names=(f"{arch}.attention.head_count", f"{arch}.attention.head_count_kv"),
        where=where,
    )
    hidden_size = size("embedding_length")
    if f"{arch}.attention.key_length" not in metadata and hidden_size < num_heads:
        raise ModelLoadError(
            f"{where}: {arch}.embedding_length ({hidden_size}) is smaller than "
            f"{arch}.attention.head_count ({num_heads}), leaving no features per head"
        )
    vocab = metadata.get("tokenizer.ggml.tokens")
    config: dict[str, Any] = {
        "model_type": arch,
        "hidden_size": hidden_size,
        "num_hidden_layers": size("block_count"),
        "intermediate_size": size("feed_forward_length"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "rms_norm_eps": float(required("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(metadata.get(f"{arch}.rope.freq_base", 10000.0)),
        "vocab_size": len(vocab) if isinstance(vocab, list) else size("vocab_size"),
        "max_position_embeddings": size("context_length", 2048),
        "head_dim": size("attention.key_length", hidden_size // num_heads),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
    }
    return config


def unpermute_rope_rows(weight: mx.array, num_heads: int) -> mx.array:
    """Undo llama.cpp's Q/K row permutation (interleaved RoPE) for half-split RoPE.

    llama.cpp's converter reshapes rows to (heads, 2, head_dim / 2) and swaps the last two
    axes; this applies the inverse. Works on packed quantized rows, scales and biases alike.

    Args:
        weight: (num_heads * head_dim, ...) projection rows.
    """
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def gguf_weights_to_mlx_lm(
    tensors: dict[str, mx.array], family: FamilyMetadata, config: dict[str, Any]
) -> dict[str, mx.array]:
    """Rename llama.cpp tensors to mlx-lm parameter paths, undoing the Q/K permutation.

    The RoPE factors tensor is not a parameter; `install_rope_factors` handles it.

    Raises:
        ModelLoadError: a tensor name has no mapping.
    """
    weights: dict[str, mx.array] = {}
    for name, tensor in tensors.items():
        if name == ROPE_FACTORS_TENSOR:
            continue
        match = _TENSOR_NAME.match(name)
        target = None
        if match:
            layer, base, suffix = match.groups()
            if layer is None and base in _GLOBAL_TENSORS:
                target = f"{_GLOBAL_TENSORS[base]}.{suffix}"
            elif layer is not None and base in _LAYER_TENSORS:
                target = f"model.layers.{layer}.{_LAYER_TENSORS[base]}.{suffix}"
                if family.gguf_rope_permuted and base in ("attn_q", "attn_k"):
                    heads = config[
                        "num_attention_heads" if base == "attn_q" else "num_key_value_heads"
                    ]
                    tensor = unpermute_rope_rows(tensor, heads)
        if target is None:
            raise ModelLoadError(
                f"GGUF tensor '{name}' has no counterpart in mlxcel's {family.model_type} model"
            )
        weights[target] = tensor
    return weights


def quantization_of(weights: dict[str, mx.array], path: str) -> dict[str, Any] | None:
    """The affine quantization parameters of layer `path`, or None if it is not quantized.

    MLX maps Q4_0 / Q4_1 / Q8_0 onto group size 32; bits follow from the packed width.
    """
    scales = weights.get(f"{path}.scales")
    if scales is None:
        return None
    packed = weights[f"{path}.weight"]
    return {"group_size": 32, "bits": packed.shape[-1] // scales.shape[-1], "mode": "affine"}


def install_rope_factors(module: nn.Module, factors: mx.array, config: dict[str, Any]) -> None:
    """Give every attention layer a RoPE scaled by llama.cpp's per-frequency factors.

    Args:
        module: an mlx-lm llama-family model whose attention layers hold `rope`.
        factors: the GGUF `rope_freqs` tensor, (head_dim / 2,) float.
    """
    for layer in module.model.layers:
        layer.self_attn.rope = FrequencyFactorRoPE(
            config["head_dim"], config["rope_theta"], factors
        )
