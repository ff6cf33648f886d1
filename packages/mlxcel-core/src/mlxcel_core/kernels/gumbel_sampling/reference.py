"""Gumbel-max sampling in plain MLX: what the kernels compute, from the same uniforms."""

from __future__ import annotations

import mlx.core as mx

from mlxcel_core.kernels.gumbel_sampling.philox import token_uniforms

FLOAT_DTYPES = (mx.float32, mx.float16, mx.bfloat16)


def check_arguments(logits: mx.array, temperatures: mx.array, seeds: mx.array) -> None:
    """Check the shapes and dtypes of a Gumbel-max draw's inputs (values are not read:
    that would wait for them).

    Raises:
        ValueError: `logits` is not (B, V) float32, float16 or bfloat16 with V >= 1,
            `temperatures` not (B,) float32, or `seeds` not (B, 2) uint32.
    """
    if logits.ndim != 2 or logits.shape[1] < 1 or logits.dtype not in FLOAT_DTYPES:
        raise ValueError(
            f"logits must be (B, V) float32, float16 or bfloat16 with V >= 1, "
            f"got {tuple(logits.shape)} {logits.dtype}"
        )
    B = logits.shape[0]
    if temperatures.shape != (B,) or temperatures.dtype != mx.float32:
        raise ValueError(
            f"temperatures must be ({B},) float32, "
            f"got {tuple(temperatures.shape)} {temperatures.dtype}"
        )
    if seeds.shape != (B, 2) or seeds.dtype != mx.uint32:
        raise ValueError(f"seeds must be ({B}, 2) uint32, got {tuple(seeds.shape)} {seeds.dtype}")


def gumbel_max_sample_reference(
    logits: mx.array, temperatures: mx.array, seeds: mx.array
) -> mx.array:
    """Draw one token per row from softmax(logits / T) by the Gumbel-max trick.

    Row b's token is argmax_v (logits[b, v] / T_b + g[b, v]) with g = -log(-log(u)) and u
    the uniforms of `token_uniforms(seeds, V)`; ties go to the lowest index. Tokens whose
    logit is -inf are never drawn; a row whose logits are all -inf draws token 0.
    Source: Gumbel 1954, "Statistical Theory of Extreme Values and Some Practical
    Applications"; Maddison, Tarlow and Minka 2014, "A* Sampling".

    Args:
        logits: (B, V) float32, float16 or bfloat16; finite or -inf, never NaN.
        temperatures: (B,) float32 divisors, each > 0.
        seeds: (B, 2) uint32 Philox keys, one per row.

    Returns:
        (B,) int32 token ids.

    Raises:
        ValueError: as `check_arguments`.
    """
    check_arguments(logits, temperatures, seeds)
    uniforms = token_uniforms(seeds, logits.shape[1])
    gumbel = -mx.log(-mx.log(uniforms))
    scores = logits.astype(mx.float32) / temperatures[:, None] + gumbel
    return mx.argmax(scores, axis=-1).astype(mx.int32)
