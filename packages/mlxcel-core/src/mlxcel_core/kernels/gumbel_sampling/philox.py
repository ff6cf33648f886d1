"""Philox-4x32-10 in plain MLX uint32 operations: the counter-based generator both the
Gumbel-max kernels and their reference draw their uniforms from.

Source: Salmon, Moraes, Dror and Shaw 2011, "Parallel Random Numbers: As Easy as 1, 2, 3"
(SC '11); constants and round as in Random123's `philox.h`, checked against its
`tests/kat_vectors`.
"""

from __future__ import annotations

import mlx.core as mx

MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
KEY_INCREMENTS = (0x9E3779B9, 0xBB67AE85)
ROUNDS = 10
# Uniforms are odd multiples of 2^-24: exact in float32 and strictly inside (0, 1).
UNIFORM_SCALE = 2.0**-24


def _mul_hi_lo(multiplier: int, x: mx.array) -> tuple[mx.array, mx.array]:
    """The high and low 32-bit words of `multiplier * x`, a 64-bit product of uint32s."""
    product = x.astype(mx.uint64) * mx.array(multiplier, dtype=mx.uint64)
    return (product >> 32).astype(mx.uint32), (product & 0xFFFFFFFF).astype(mx.uint32)


def philox4x32_10(
    counter: tuple[mx.array, mx.array, mx.array, mx.array], key: tuple[mx.array, mx.array]
) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """Philox-4x32-10 of `counter` under `key`, elementwise over broadcast uint32 arrays.

    Args:
        counter: the four uint32 words of each counter.
        key: the two uint32 words of each key.

    Returns:
        The four uint32 words of each output.
    """
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for round_index in range(ROUNDS):
        if round_index:
            k0 = k0 + mx.array(KEY_INCREMENTS[0], dtype=mx.uint32)
            k1 = k1 + mx.array(KEY_INCREMENTS[1], dtype=mx.uint32)
        hi0, lo0 = _mul_hi_lo(MULTIPLIERS[0], c0)
        hi1, lo1 = _mul_hi_lo(MULTIPLIERS[1], c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def token_uniforms(seeds: mx.array, vocab_size: int) -> mx.array:
    """Each row's uniform for each token, as the kernels draw them.

    Token v of row b takes word v % 4 of Philox-4x32-10 at counter (v // 4, 0, 0, 0)
    under key `seeds[b]`; with r its top 24 bits, u = (r | 1) * 2^-24.

    Args:
        seeds: (B, 2) uint32 keys, one per row.
        vocab_size: V, the tokens per row.

    Returns:
        (B, V) float32 uniforms in [2^-24, 1 - 2^-24].
    """
    num_groups = -(-vocab_size // 4)
    group = mx.arange(num_groups, dtype=mx.uint32)[None, :]
    zero = mx.zeros_like(group)
    key = (seeds[:, 0:1].astype(mx.uint32), seeds[:, 1:2].astype(mx.uint32))
    words = mx.stack(philox4x32_10((group, zero, zero, zero), key), axis=-1)
    bits = words.reshape(seeds.shape[0], num_groups * 4)[:, :vocab_size]
    odd = (bits >> 8) | 1
    return odd.astype(mx.float32) * UNIFORM_SCALE
