"""What each GGUF tensor type becomes in MLX, and the conversion of one tensor.

Float tensors (F32, F16, BF16) load as they are. Quantized ones become MLX quantization:
- the types that are affine quantization in another layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
  Q4_K, Q5_K, TQ1_0, TQ2_0) keep their codes (`gguf_affine`); MXFP4 keeps its bytes in
  MLX's `mxfp4` mode;
- the others (Q2_K, Q3_K, Q6_K, the I-quants, NVFP4) are dequantized with
  `gguf.quants.dequantize` and quantized again with `mx.quantize` at their code width (2, 3,
  4 or 6 bits), with the group size whose bits per weight (bits + 32 / group for the
  float16 scale and bias) come nearest the file's.
`GGUFDequant.BF16` makes every quantized tensor dense bfloat16 instead, and a tensor that
MLX cannot quantize (not a linear or embedding weight, or rows not divisible by the group)
is dense in float16.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

import mlx.core as mx
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from mlxcel_models.loading.gguf_affine import (
    AFFINE_TYPES,
    affine_blocks,
    mxfp4_blocks,
    pack_codes,
)

MLX_GROUP_SIZES = (32, 64, 128)
# Values dequantized at once when a tensor is requantized: bounds the float32 copy.
_ROWS_ELEMENTS = 1 << 24


class GGUFDequant(StrEnum):
    """How quantized GGUF tensors load (`--gguf-dequant`).

    AUTO: as MLX quantization at the nearest bit width. BF16: dense bfloat16.
    """

    AUTO = "auto"
    BF16 = "bf16"


_FLOAT_DTYPES = {
    GGMLQuantizationType.F32: mx.float32,
    GGMLQuantizationType.F16: mx.float16,
    GGMLQuantizationType.BF16: mx.bfloat16,
}
# The code width of the types requantized with mx.quantize (MLX's smallest is 2 bits).
_REQUANTIZED_BITS = {
    GGMLQuantizationType.Q2_K: 2,
    GGMLQuantizationType.Q3_K: 3,
    GGMLQuantizationType.Q6_K: 6,
    GGMLQuantizationType.IQ1_S: 2,
    GGMLQuantizationType.IQ1_M: 2,
    GGMLQuantizationType.IQ2_XXS: 2,
    GGMLQuantizationType.IQ2_XS: 2,
    GGMLQuantizationType.IQ2_S: 2,
    GGMLQuantizationType.IQ3_XXS: 3,
    GGMLQuantizationType.IQ3_S: 3,
    GGMLQuantizationType.IQ4_NL: 4,
    GGMLQuantizationType.IQ4_XS: 4,
    GGMLQuantizationType.NVFP4: 4,
}
_MXFP4 = GGMLQuantizationType.MXFP4
LOADABLE_TYPES = frozenset(
    qtype.name for qtype in (*_FLOAT_DTYPES, *AFFINE_TYPES, *_REQUANTIZED_BITS, _MXFP4)
)
"""The ggml types mlxcel loads."""


@dataclass(frozen=True)
class TensorForm:
    """How one tensor is held in MLX.

    Attributes:
        dtype: the dense dtype; None for a quantized tensor.
        mode: MLX quantization mode ("affine", "mxfp4"); None for a dense tensor.
        bits: bits per quantized value.
        group_size: values per scale.
        exact: the file's codes are kept (a quantized tensor) or its values are held
            exactly (a dense one).
    """

    dtype: mx.Dtype | None = None
    mode: str | None = None
    bits: int = 0
    group_size: int = 0
    exact: bool = True

    @property
    def is_quantized(self) -> bool:
        return self.mode is not None

    @property
    def label(self) -> str:
        """How the stats line names it ("4-bit g32", "mxfp4", "bf16")."""
        if self.mode == "affine":
            return f"{self.bits}-bit g{self.group_size}"
        if self.mode is not None:
            return self.mode
        return str(self.dtype).removeprefix("mlx.core.")

    def quantization(self) -> dict[str, int | str]:
        """The `nn.quantize` parameters of a layer holding this tensor."""
        return {"group_size": self.group_size, "bits": self.bits, "mode": self.mode}


def bits_per_weight(qtype: GGMLQuantizationType) -> float:
    """Bits a ggml type stores per value, block scales included."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    return type_size * 8 / block_size


def requantized_form(qtype: GGMLQuantizationType) -> TensorForm:
    """The affine form of a type that is dequantized and quantized again: its code width,
    and the group size whose bits per weight come nearest the file's (the smaller on a tie).
    """
    bits = _REQUANTIZED_BITS[qtype]
    target = bits_per_weight(qtype)
    group = min(MLX_GROUP_SIZES, key=lambda g: (abs(bits + 32 / g - target), g))
    return TensorForm(mode="affine", bits=bits, group_size=group, exact=False)


def plan_tensor(
    type_name: str, shape: tuple[int, ...], *, quantizable: bool, dequant: GGUFDequant
) -> TensorForm:
    """How a tensor of ggml type `type_name` and `shape` loads.

    Args:
        type_name: the ggml type name (`GGUFTensorInfo.type_name`).
        shape: its shape, outermost axis first.
        quantizable: the layer holding it can be quantized (a linear or embedding weight).
        dequant: the user's choice for quantized tensors.

    Raises:
        ValueError: the type is not one mlxcel loads (`LOADABLE_TYPES`).
    """
    if type_name not in LOADABLE_TYPES:
        loadable = ", ".join(sorted(LOADABLE_TYPES))
        raise ValueError(f"ggml type {type_name} cannot be loaded; mlxcel loads {loadable}")
    qtype = GGMLQuantizationType[type_name]
    if qtype in _FLOAT_DTYPES:
        return TensorForm(dtype=_FLOAT_DTYPES[qtype])
    if dequant is GGUFDequant.BF16:
        return TensorForm(dtype=mx.bfloat16, exact=False)
    if qtype is _MXFP4:
        form = TensorForm(mode="mxfp4", bits=4, group_size=32)
    elif qtype in AFFINE_TYPES:
        bits, group = AFFINE_TYPES[qtype]
        form = TensorForm(mode="affine", bits=bits, group_size=group)
    else:
        form = requantized_form(qtype)
    if not quantizable or len(shape) < 2 or shape[-1] % form.group_size:
        return TensorForm(dtype=mx.float16, exact=False)
    return form


def dequantize(rows: np.ndarray, type_name: str) -> np.ndarray:
    """Float32 values of raw ggml rows ((..., bytes per row) uint8), via gguf-py."""
    return quants.dequantize(rows, GGMLQuantizationType[type_name]).astype(np.float32)


def convert_tensor(rows: np.ndarray, type_name: str, form: TensorForm) -> dict[str, mx.array]:
    """One GGUF tensor in MLX form, evaluated.

    Args:
        rows: its raw data, (..., bytes per row) uint8 (`GGUFTensorData.blocks`).
        type_name: its ggml type.
        form: what it becomes (`plan_tensor`).

    Returns:
        {"weight"} for a dense tensor (its values in `form.dtype`); {"weight", "scales"
        and, for affine, "biases"} for a quantized one, leading axes kept.
    """
    lead = rows.shape[:-1]
    flat = rows.reshape(-1, rows.shape[-1]) if rows.ndim > 1 else rows
    if not form.is_quantized:
        parts = {
            "weight": [
                mx.array(dequantize(chunk, type_name)).astype(form.dtype)
                for chunk in _row_chunks(flat, type_name)
            ]
        }
    else:
        parts = {}
        for chunk in _row_chunks(flat, type_name):
            for key, value in _quantize_rows(chunk, type_name, form).items():
                parts.setdefault(key, []).append(value)
    result = {}
    for key, chunks in parts.items():
        value = mx.concatenate(chunks) if len(chunks) > 1 else chunks[0]
        result[key] = value.reshape(*lead, value.shape[-1]) if rows.ndim > 1 else value
        mx.eval(result[key])
    return result


def _row_chunks(rows: np.ndarray, type_name: str) -> Iterator[np.ndarray]:
    if rows.ndim == 1:
        yield rows
        return
    block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    per_row = rows.shape[-1] // type_size * block_size
    step = max(1, _ROWS_ELEMENTS // per_row)
    for start in range(0, rows.shape[0], step):
        yield rows[start : start + step]


def _quantize_rows(rows: np.ndarray, type_name: str, form: TensorForm) -> dict[str, mx.array]:
    qtype = GGMLQuantizationType[type_name]
    if qtype is _MXFP4:
        codes, scales = mxfp4_blocks(rows)
        return {"weight": mx.array(pack_codes(codes, 4)), "scales": mx.array(scales)}
    if form.exact:
        blocks = affine_blocks(rows, qtype)
        return {
            "weight": mx.array(pack_codes(blocks.codes, form.bits)),
            "scales": mx.array(blocks.scales),
            "biases": mx.array(blocks.biases),
        }
    values = mx.array(dequantize(rows, type_name)).astype(mx.float16)
    weight, scales, biases = mx.quantize(values, group_size=form.group_size, bits=form.bits)
    return {"weight": weight, "scales": scales, "biases": biases}
