"""The expert kernels of mlx-lm's Muse Spark in plain MLX, for devices without Metal.

Each function takes the arguments of, and computes what, the mlx-lm function of the same
name in `mlx_lm.kernels` computes in its Metal kernel, in float32, rounded where the
kernel rounds.
"""

from __future__ import annotations

import mlx.core as mx

_F32 = mx.float32


def expert_routing(
    logits: mx.array,
    expert_bias: mx.array,
    *,
    top_k: int,
    multiplier: float,
    score_eps: float,
    route_scale: float,
) -> list[mx.array]:
    """mlx-lm's `expert_routing`: each token's top-k experts and their weights from its
    router logits (..., E).

    An expert's score is sigmoid(logit * multiplier) (computed from exp(-|x|), as the
    kernel does); experts are chosen by score + bias, highest first, the lower index on a
    tie; the weights are the chosen scores over (their sum + `score_eps`), times
    `route_scale`, the sum taken in the order chosen.

    Returns:
        [inds, weights]: uint32 and float32, both (..., top_k).
    """
    scaled = logits.astype(_F32) * multiplier
    tail = 1 / (1 + mx.exp(mx.abs(scaled)))
    scores = mx.where(scaled < 0, tail, 1 - tail)
    biased = scores + expert_bias.astype(_F32)
    experts = mx.arange(logits.shape[-1], dtype=mx.uint32)
    chosen, weights = [], []
    for _ in range(top_k):
        best = mx.max(biased, axis=-1, keepdims=True)
        index = mx.min(mx.where(biased == best, experts, logits.shape[-1]), axis=-1)
        chosen.append(index)
        weights.append(mx.take_along_axis(scores, index[..., None], axis=-1)[..., 0])
        biased = mx.where(experts == index[..., None], -mx.inf, biased)
    total = weights[0]
    for weight in weights[1:]:
        total = weight + total
    normalized = [weight / (total + score_eps) * route_scale for weight in weights]
    return [mx.stack(chosen, axis=-1).astype(mx.uint32), mx.stack(normalized, axis=-1)]


def post_expert_norm_combine(
    experts: mx.array, weights: mx.array, *, norm_weight: mx.array, eps: float
) -> mx.array:
    """mlx-lm's `post_expert_norm_combine`: each expert's output (..., K, D) RMS-normed
    with `norm_weight` scaling its input, then the K outputs added with their weights
    (..., K) in order, the sum rounded to the experts' dtype after each addition.

    Returns:
        (..., D) in the experts' dtype.
    """
    dtype = experts.dtype
    scaled = experts.astype(_F32) * norm_weight.astype(_F32)
    normed = scaled * mx.rsqrt(mx.mean(scaled * scaled, axis=-1, keepdims=True) + eps)
    expert_weights = weights.astype(dtype).astype(_F32)
    total = mx.zeros(scaled.shape[:-2] + scaled.shape[-1:], dtype=_F32)
    for k in range(experts.shape[-2]):
        total = (total + normed[..., k, :] * expert_weights[..., k, None]).astype(dtype)
        total = total.astype(_F32)
    return total.astype(dtype)
