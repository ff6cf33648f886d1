"""The ggml block types that are MLX formats in disguise, repacked without requantizing.

Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q5_K store, for each run of 32 values, integer codes
`q` and one scale and one offset: `x = scale * q + bias` with `q` in [0, 2^bits). That is
MLX's affine quantization at group size 32, so their codes are kept as they are and only
the scale and bias are written as float16 (exact for the 32-block types, whose scales are
float16 already; for Q4_K and Q5_K the product of the super-block scale and the 6-bit
sub-block scale is rounded to float16). TQ1_0 and TQ2_0 hold ternary codes with one scale
per 256 values: MLX's 2-bit affine form at group size 128 holds them exactly. MXFP4 is
MLX's own `mxfp4` mode byte for byte, its values in another order.

Block layouts: ggml/src/ggml-common.h; value formulas: `gguf.quants` (gguf-py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants


@dataclass(frozen=True)
class AffineBlocks:
    """A tensor in MLX's affine form, still as numpy arrays.

    Attributes:
        codes: (rows, columns) uint8 integer codes in [0, 2^bits).
        scales: (rows, columns / group_size) float16.
        biases: (rows, columns / group_size) float16; a value is `scale * code + bias`.
    """

    codes: np.ndarray
    scales: np.ndarray
    biases: np.ndarray


@dataclass(frozen=True)
class _Layout:
    bits: int
    group_size: int
    # (rows, blocks, bytes) -> per-group scale and bias, float32, (rows, groups) each.
    scale_bias: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
    # (rows, blocks, bytes) -> (rows, values) codes, for the types whose bits are simply
    # laid out; None derives them from the dequantized values.
    codes: Callable[[np.ndarray], np.ndarray] | None = None


def _nibbles(start: int) -> Callable[[np.ndarray], np.ndarray]:
    """Q4_0 / Q4_1 codes: 16 bytes from `start`, values 0-15 low nibbles, 16-31 high."""

    def codes(blocks: np.ndarray) -> np.ndarray:
        packed = blocks[..., start : start + 16]
        return np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(len(blocks), -1)

    return codes


def _nibbles_and_high_bits(start: int) -> Callable[[np.ndarray], np.ndarray]:
    """Q5_0 / Q5_1 codes: a uint32 of fifth bits at `start`, then Q4-style nibbles."""
    low = _nibbles(start + 4)

    def codes(blocks: np.ndarray) -> np.ndarray:
        high = blocks[..., start : start + 4].copy().view(np.uint32)
        fifth = (high >> np.arange(32, dtype=np.uint32)) & 1
        return low(blocks) | (fifth.astype(np.uint8) << 4).reshape(len(blocks), -1)

    return codes


def _signed_bytes(blocks: np.ndarray) -> np.ndarray:
    """Q8_0 codes: 32 int8 values after the scale, offset to [0, 256)."""
    return (
        (blocks[..., 2:].view(np.int8).astype(np.int16) + 128)
        .astype(np.uint8)
        .reshape(len(blocks), -1)
    )


def _half(blocks: np.ndarray, start: int) -> np.ndarray:
    return blocks[..., start : start + 2].copy().view(np.float16)[..., 0].astype(np.float32)


def _symmetric(offset: int) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """`x = d * (q - offset)`, d the block's leading float16."""

    def scale_bias(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d = _half(blocks, 0)
        return d, -offset * d

    return scale_bias


def _with_minimum(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`x = d * q + m`, d and m the block's leading float16 pair."""
    return _half(blocks, 0), _half(blocks, 2)


def _k_quant(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: `x = d * sc_j * q - dmin * m_j` in each of 8 sub-blocks of 32."""
    rows, num_blocks, _ = blocks.shape
    d, dmin = _half(blocks, 0)[..., None], _half(blocks, 2)[..., None]
    sc, m = quants.Q4_K.get_scale_min(blocks[..., 4:16].reshape(-1, 12))
    sc = sc.reshape(rows, num_blocks, 8).astype(np.float32)
    m = m.reshape(rows, num_blocks, 8).astype(np.float32)
    return (d * sc).reshape(rows, -1), (-dmin * m).reshape(rows, -1)


def _ternary(scale_offset: int) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """TQ1_0 / TQ2_0: `x = d * (q - 1)` over 256 values, d a float16 at `scale_offset`;
    two groups of 128 share it."""

    def scale_bias(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d = np.repeat(_half(blocks, scale_offset), 2, axis=-1)
        return d, -d

    return scale_bias


_LAYOUTS = {
    GGMLQuantizationType.Q4_0: _Layout(4, 32, _symmetric(8), _nibbles(2)),
    GGMLQuantizationType.Q4_1: _Layout(4, 32, _with_minimum, _nibbles(4)),
    GGMLQuantizationType.Q5_0: _Layout(5, 32, _symmetric(16), _nibbles_and_high_bits(2)),
    GGMLQuantizationType.Q5_1: _Layout(5, 32, _with_minimum, _nibbles_and_high_bits(4)),
    GGMLQuantizationType.Q8_0: _Layout(8, 32, _symmetric(128), _signed_bytes),
    GGMLQuantizationType.Q4_K: _Layout(4, 32, _k_quant),
    GGMLQuantizationType.Q5_K: _Layout(5, 32, _k_quant),
    GGMLQuantizationType.TQ1_0: _Layout(2, 128, _ternary(52)),
    GGMLQuantizationType.TQ2_0: _Layout(2, 128, _ternary(64)),
}
AFFINE_TYPES: dict[GGMLQuantizationType, tuple[int, int]] = {
    qtype: (layout.bits, layout.group_size) for qtype, layout in _LAYOUTS.items()
}
"""The types repacked as affine quantization, with their (bits, group size)."""


def affine_blocks(rows: np.ndarray, qtype: GGMLQuantizationType) -> AffineBlocks:
    """The codes, scales and biases of `rows` of a type in `AFFINE_TYPES`.

    The 32-value types' codes are read from their bits; the others' come from
    `gguf.quants.dequantize`'s values and the block's own scale and bias
    (`q = (x - bias) / scale`), so their bit unpacking is not repeated here.

    Args:
        rows: (rows, bytes per row) uint8, whole blocks of `qtype`.
        qtype: the ggml type.

    Returns:
        The affine form of the (rows, values per row) tensor.
    """
    layout = _LAYOUTS[qtype]
    type_size = GGML_QUANT_SIZES[qtype][1]
    num_rows = rows.shape[0]
    blocks = rows.reshape(num_rows, -1, type_size)
    scale, bias = layout.scale_bias(blocks)
    if layout.codes is not None:
        codes = layout.codes(blocks)
    else:
        values = quants.dequantize(rows, qtype).reshape(num_rows, scale.shape[-1], -1)
        safe = np.where(scale == 0, 1, scale)[..., None]
        derived = np.where(scale[..., None] == 0, 0, np.rint((values - bias[..., None]) / safe))
        codes = np.clip(derived, 0, 2**layout.bits - 1).astype(np.uint8).reshape(num_rows, -1)
    return AffineBlocks(codes, scale.astype(np.float16), bias.astype(np.float16))


def mxfp4_blocks(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MXFP4 rows as MLX's `mxfp4` mode holds them.

    A ggml MXFP4 block is one E8M0 scale byte and 16 bytes of 4-bit E2M1 codes, values
    0-15 in the low nibbles and 16-31 in the high ones; MLX wants the codes in order.

    Args:
        rows: (rows, bytes per row) uint8, whole MXFP4 blocks.

    Returns:
        (rows, values per row) uint8 codes and (rows, values / 32) uint8 scales.
    """
    blocks = rows.reshape(rows.shape[0], -1, GGML_QUANT_SIZES[GGMLQuantizationType.MXFP4][1])
    packed = blocks[..., 1:]
    codes = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)
    return codes.reshape(rows.shape[0], -1), np.ascontiguousarray(blocks[..., 0])


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack integer codes as MLX's quantized weights do: a little-endian bit stream of
    `bits`-bit values in uint32 words.

    Args:
        codes: (rows, columns) uint8, each below 2^bits; columns divisible by 32.

    Returns:
        (rows, columns * bits / 32) uint32.
    """
    rows = codes.shape[0]
    if 8 % bits == 0:
        per_byte = codes.reshape(rows, -1, 8 // bits)
        packed = per_byte[..., 0].copy()
        for index in range(1, 8 // bits):
            packed |= per_byte[..., index] << (index * bits)
        return packed.view(np.uint32)
    # Eight codes fill `bits` bytes exactly: gather them in one little-endian uint64.
    eights = codes.reshape(rows, -1, 8).astype(np.uint64)
    shifts = np.arange(0, 8 * bits, bits, dtype=np.uint64)
    words = np.bitwise_or.reduce(eights << shifts, axis=-1)
    packed = words.view(np.uint8).reshape(rows, -1, 8)[..., :bits]
    return np.ascontiguousarray(packed).reshape(rows, -1).view(np.uint32)
