"""BitNet b1.58 (`bitnet`) in GGUF files: ternary matrices repacked for mlx-lm's `BitLinear`.

llama.cpp's converter (`BitnetModel.weight_quant`) stores each BitLinear matrix as floats
holding only 0 and ±s, s the mean absolute value of the checkpoint's matrix; quantizing the
file turns them into ternary blocks (TQ1_0, TQ2_0) with a scale per block. mlx-lm's
`BitLinear` holds the ternary values packed four to a byte, (out / 4, in) uint8: byte (r, c)
keeps rows r, r + out/4, r + 2 out/4 and r + 3 out/4 of column c as the weight + 1 in its bit
pairs from the lowest, and one scale it multiplies the product by. The loader reads each
matrix dense, takes s as its largest magnitude, and packs W / s.

mlx-lm's BitNet squares a ReLU in its MLP; llama.cpp runs SiLU there unless the file's
`hidden_activation` says otherwise (the converter writes none, as the 1bitLLM checkpoints it
was written for use SiLU), so only files that name `relu2` load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mlx.core as mx

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.loading.gguf_config import GGUFMetadata
from mlxcel_models.loading.gguf_layouts import TensorJoin

# GGUF tensor within a layer → the mlx-lm BitLinear layer holding it.
_BITLINEAR_LAYERS = {
    "attn_q.weight": "self_attn.q_proj",
    "attn_k.weight": "self_attn.k_proj",
    "attn_v.weight": "self_attn.v_proj",
    "attn_output.weight": "self_attn.o_proj",
    "ffn_gate.weight": "mlp.gate_proj",
    "ffn_up.weight": "mlp.up_proj",
    "ffn_down.weight": "mlp.down_proj",
}
_WEIGHTS_PER_BYTE = 4
# How far a stored value may lie from 0 or ±s, relative to s (a Q8_0 block keeps s to
# float16 precision); farther, the matrix was not ternary when it was quantized.
_TERNARY_TOLERANCE = 1e-2

# mlx-lm names the sub-norms as Microsoft's BitNet does, gguf-py as 1bitLLM's checkpoints.
BITNET_SUB_NORMS = (
    ("self_attn.attn_sub_norm", "self_attn.inner_attn_ln"),
    ("mlp.ffn_sub_norm", "mlp.ffn_layernorm"),
)


def bitnet_config(meta: GGUFMetadata, config: dict[str, Any]) -> dict[str, Any]:
    """BitNet's keys beyond the common ones: none, once the file's MLP activation is
    checked to be the squared ReLU mlx-lm's family computes.

    Raises:
        ModelLoadError: the file's `hidden_activation` is not `relu2`.
    """
    activation = meta.get("hidden_activation")
    if activation != "relu2":
        named = "none (llama.cpp runs SiLU)" if activation is None else repr(activation)
        raise ModelLoadError(
            f"{meta.where}: bitnet.hidden_activation is {named}; mlx-lm's bitnet computes "
            "relu2 (squared ReLU) only"
        )
    return {}


def pack_ternary(weight: mx.array) -> tuple[mx.array, mx.array]:
    """A matrix of 0 and ±s as mlx-lm's BitLinear holds it.

    Args:
        weight: (out_features, in_features) float; out_features a multiple of 4.

    Returns:
        The packed (out_features / 4, in_features) uint8 codes and the (1,) float32 scale s.

    Raises:
        ValueError: out_features is not a multiple of 4, or a value lies off 0 and ±s.
    """
    rows = weight.shape[0]
    if rows % _WEIGHTS_PER_BYTE:
        raise ValueError(f"has {rows} rows; BitLinear packs a multiple of 4")
    values = weight.astype(mx.float32)
    scale = mx.max(mx.abs(values))
    scale = mx.where(scale > 0, scale, 1.0)
    ternary = mx.clip(mx.round(values / scale), -1, 1)
    if mx.max(mx.abs(values - ternary * scale)).item() > _TERNARY_TOLERANCE * scale.item():
        raise ValueError("holds values other than 0 and ±one scale (not ternary)")
    codes = (ternary + 1).astype(mx.uint8).reshape(_WEIGHTS_PER_BYTE, rows // 4, -1)
    packed = sum(codes[i] << (2 * i) for i in range(_WEIGHTS_PER_BYTE))
    return packed.astype(mx.uint8), scale.reshape(1)


def bitlinear_weights(
    tensors: Mapping[str, mx.array], config: Mapping[str, Any]
) -> dict[str, mx.array]:
    """The BitLinear parameters of a layer's ternary matrices read so far (one at a time:
    each is complete alone).

    Raises:
        ModelLoadError: a matrix is not ternary or its rows do not pack.
    """
    weights = {}
    for name, weight in tensors.items():
        layer = _BITLINEAR_LAYERS[name]
        try:
            packed, scale = pack_ternary(weight)
        except ValueError as error:
            raise ModelLoadError(f"bitnet tensor {name} (mlx-lm {layer}) {error}") from error
        weights |= {f"{layer}.weight": packed, f"{layer}.weight_scale": scale}
    return weights


BITLINEAR_WEIGHTS = TensorJoin(frozenset(_BITLINEAR_LAYERS), bitlinear_weights)
