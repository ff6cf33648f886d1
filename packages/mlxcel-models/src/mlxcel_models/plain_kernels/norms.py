"""The norm kernels of mlx-lm's Muse Spark in plain MLX, for devices without Metal.

Each function takes the arguments of, and computes what, the mlx-lm function of the same
name in `mlx_lm.kernels` computes in its Metal kernel: float32 arithmetic, rounded to
the activations' dtype T exactly where the kernel rounds (`static_cast<T>`). Sums run
in MLX's order, not the kernel's SIMD order, so results agree to float32 rounding.
"""

from __future__ import annotations

import math

import mlx.core as mx
from mlx import nn

_F32 = mx.float32


def _rstd(x: mx.array, eps: float) -> mx.array:
    """1 / sqrt(mean(x²) + eps) over the last axis, kept for broadcasting."""
    return mx.rsqrt(mx.mean(x * x, axis=-1, keepdims=True) + eps)


def _round(x: mx.array, dtype: mx.Dtype) -> mx.array:
    """x rounded to `dtype` and read back as float32, as the kernels' casts do."""
    return x.astype(dtype).astype(_F32)


def _normed_heads(
    qkvg: mx.array, n_heads: int, n_kv_heads: int, head_dim: int, eps: float, query_scale: float
) -> tuple[mx.array, mx.array]:
    """The q and k heads of (..., 2 (HQ + HK) D) qkvg rows, each RMS-normed without a
    weight and rounded to T, q then scaled by `query_scale` and rounded again: float32
    (..., HQ, D) and (..., HK, D)."""
    dtype = qkvg.dtype
    heads = qkvg[..., : (n_heads + n_kv_heads) * head_dim].astype(_F32)
    heads = heads.reshape(*qkvg.shape[:-1], n_heads + n_kv_heads, head_dim)
    normed = _round(heads * _rstd(heads, eps), dtype)
    queries = _round(normed[..., :n_heads, :] * query_scale, dtype)
    return queries, normed[..., n_heads:, :]


def qk_norm(
    qkvg: mx.array,
    *,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    eps: float,
    query_scale: float,
) -> list[mx.array]:
    """mlx-lm's `qk_norm`: q (..., n_heads, head_dim) and k (..., n_kv_heads, head_dim)
    in qkvg's dtype, from qkvg (..., 2 (n_heads + n_kv_heads) head_dim)."""
    queries, keys = _normed_heads(qkvg, n_heads, n_kv_heads, head_dim, eps, query_scale)
    return [queries.astype(qkvg.dtype), keys.astype(qkvg.dtype)]


def _rotate_traditional(x: mx.array, positions: mx.array, log2_base: float) -> mx.array:
    """Rotate float32 (..., L, H, D) x at (..., L) positions as mx.fast.rope with
    traditional=True: pairs (2i, 2i + 1) by the angle position * 2^(-(i / (D/2)) log2
    base), in float32 (`log2_base` taken as a float32, as the kernel's scalar)."""
    *_, D = x.shape
    half = D // 2
    inverse_frequencies = mx.power(2.0, -(mx.arange(half, dtype=_F32) / half) * log2_base)
    angles = positions.astype(_F32)[..., None, None] * inverse_frequencies
    cos, sin = mx.cos(angles), mx.sin(angles)
    pairs = x.reshape(*x.shape[:-1], half, 2)
    even, odd = pairs[..., 0], pairs[..., 1]
    rotated = mx.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
    return rotated.reshape(x.shape)


def qk_norm_rope(
    qkvg: mx.array,
    *,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    eps: float,
    query_scale: float,
    rope_base: float,
    offset: int | mx.array,
) -> list[mx.array]:
    """mlx-lm's `qk_norm_rope`: `qk_norm`, then q and k rotated as mx.fast.rope
    (traditional=True) rotates them, the tokens of (..., L) at positions offset, offset
    + 1, …; `offset` an int, or an array of one offset per row of the leading axes (or
    one for all)."""
    dtype = qkvg.dtype
    queries, keys = _normed_heads(qkvg, n_heads, n_kv_heads, head_dim, eps, query_scale)
    tokens = qkvg.shape[:-1]
    steps = mx.arange(tokens[-1], dtype=mx.int32)
    if isinstance(offset, mx.array) and offset.size > 1:
        positions = offset.reshape(*tokens[:-1], 1).astype(mx.int32) + steps
    else:
        first = offset.reshape(-1)[0] if isinstance(offset, mx.array) else offset
        positions = mx.broadcast_to(steps + first, tokens)
    log2_base = math.log2(rope_base)
    return [
        _rotate_traditional(queries, positions, log2_base).astype(dtype),
        _rotate_traditional(keys, positions, log2_base).astype(dtype),
    ]


def rms_norm_sigmoid_gate(x: mx.array, gate: mx.array, *, eps: float) -> mx.array:
    """mlx-lm's `rms_norm_sigmoid_gate`: rms_norm(x) * sigmoid(gate) per head, in float32,
    rounded once; x (B, H, L, D), gate (B, L, H D), the result (B, L, H D) in x's dtype."""
    B, H, L, D = x.shape
    heads = x.transpose(0, 2, 1, 3).astype(_F32)
    gates = gate.reshape(B, L, H, D).astype(_F32)
    gated = heads * _rstd(heads, eps) * (1 / (1 + mx.exp(-gates)))
    return gated.astype(x.dtype).reshape(B, L, H * D)


def norm_add_norm(
    branch: mx.array,
    stream: mx.array,
    *,
    alpha: mx.array,
    beta: mx.array,
    post_weight: mx.array | None,
    post_eps: float,
    next_norm: nn.RMSNorm | None,
) -> tuple[mx.array, mx.array | None]:
    """mlx-lm's `norm_add_norm`: the branch (..., D) post-normed (its input first scaled
    by `post_weight` in T, where given), added to the float32 stream with the gate
    weights (alpha stream + beta normed), then the sum pre-normed with `next_norm`.

    Returns:
        The float32 new stream, and the normed sum in the branch's dtype (None without
        `next_norm`).
    """
    dtype = branch.dtype
    values = branch.astype(_F32)
    if post_weight is not None:
        values = _round(_round(post_weight, dtype) * values, dtype)
    normed = _round(values * _rstd(values, post_eps), dtype)
    new_stream = alpha.astype(_F32) * stream.astype(_F32) + beta.astype(_F32) * normed
    if next_norm is None:
        return new_stream, None
    return new_stream, pre_norm(new_stream, next_norm, dtype=dtype)


def pre_norm(stream: mx.array, norm: nn.RMSNorm, *, dtype: mx.Dtype) -> mx.array:
    """mlx-lm's `pre_norm`: the float32 stream (..., D) RMS-normed with `norm`'s weight
    and epsilon in float32, rounded to `dtype`."""
    values = stream.astype(_F32)
    return (values * _rstd(values, norm.eps) * norm.weight.astype(_F32)).astype(dtype)
