"""Tight packing of b-bit codes into bytes: 8 codes of b bits in b bytes."""

from __future__ import annotations

import mlx.core as mx

# Codes are packed in runs of 8, so a run of b-bit codes fills exactly b bytes.
RUN = 8


def _check(bits: int, num_codes: int) -> None:
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be in [1, 8], got {bits}")
    if num_codes % RUN:
        raise ValueError(f"the number of codes must be a multiple of {RUN}, got {num_codes}")


def packed_width(bits: int, num_codes: int) -> int:
    """Bytes that `num_codes` codes of `bits` bits take packed."""
    _check(bits, num_codes)
    return num_codes * bits // RUN


def pack_bits(codes: mx.array, bits: int) -> mx.array:
    """Pack the last axis of b-bit codes, bit planes first.

    Byte k of a run of 8 codes holds bit k of each of them (code i in bit i), so any b
    from 1 to 8 packs without padding.

    Args:
        codes: (..., C) uint8 codes, each < 2**bits; C a multiple of 8.
        bits: bits per code.

    Returns:
        (..., C * bits / 8) uint8.

    Raises:
        ValueError: `bits` is outside [1, 8] or C is not a multiple of 8.
    """
    *lead, num_codes = codes.shape
    _check(bits, num_codes)
    runs = codes.astype(mx.uint8).reshape(*lead, num_codes // RUN, 1, RUN)
    planes = mx.arange(bits, dtype=mx.uint8)[:, None]
    positions = mx.arange(RUN, dtype=mx.uint8)
    bit_values = ((runs >> planes) & 1) << positions
    packed = mx.sum(bit_values, axis=-1).astype(mx.uint8)
    return packed.reshape(*lead, num_codes // RUN * bits)


def unpack_bits(packed: mx.array, bits: int) -> mx.array:
    """Invert `pack_bits`.

    Args:
        packed: (..., P) uint8, P a multiple of `bits`.
        bits: bits per code.

    Returns:
        (..., P * 8 / bits) uint8 codes.

    Raises:
        ValueError: `bits` is outside [1, 8] or P is not a multiple of `bits`.
    """
    *lead, width = packed.shape
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be in [1, 8], got {bits}")
    if width % bits:
        raise ValueError(f"the packed width must be a multiple of bits={bits}, got {width}")
    planes = packed.reshape(*lead, width // bits, bits, 1)
    positions = mx.arange(RUN, dtype=mx.uint8)
    weights = mx.arange(bits, dtype=mx.uint8)[:, None]
    codes = mx.sum(((planes >> positions) & 1) << weights, axis=-2).astype(mx.uint8)
    return codes.reshape(*lead, width // bits * RUN)
