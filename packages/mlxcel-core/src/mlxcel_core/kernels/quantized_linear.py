"""Linear layers over affine-quantized weights, with a dense tactic for prefill."""

from __future__ import annotations

import mlx.core as mx


def quantized_linear(
    x: mx.array,
    weight: mx.array,
    scales: mx.array,
    biases: mx.array,
    *,
    group_size: int,
    bits: int,
    bias: mx.array | None = None,
    dequantize_min_rows: int | None = None,
) -> mx.array:
    """`x @ W.T (+ bias)` for a weight W stored with MLX affine quantization.

    With at least `dequantize_min_rows` rows of input (a prefill chunk), W is dequantized
    once to x's dtype and multiplied as a dense matrix, which runs as a BLAS GEMM on the CPU;
    MLX's CPU `quantized_matmul` does not, and is several times slower there at large M.
    With fewer rows (decode) the quantized product reads 4-8x fewer bytes and wins.

    Args:
        x: (..., K) activations, float.
        weight: (N, K * bits / 32) uint32 packed weight.
        scales: (N, K / group_size) per-group scales.
        biases: (N, K / group_size) per-group offsets.
        group_size: quantization group size (elements).
        bits: bits per element.
        bias: optional (N,) output bias.
        dequantize_min_rows: rows of x (all leading axes together) from which the dense
            tactic is used; None always uses `mx.quantized_matmul`.

    Returns:
        (..., N) in x's dtype.
    """
    rows = x.size // x.shape[-1]
    if dequantize_min_rows is not None and rows >= dequantize_min_rows:
        # Without the dependency on x, MLX may dequantize the weights of many layers
        # before it needs any of them, holding all their dense copies at once.
        (weight,) = mx.depends([weight], [x])
        dense = mx.dequantize(weight, scales, biases, group_size=group_size, bits=bits)
        y = x @ dense.astype(x.dtype).T
    else:
        y = mx.quantized_matmul(
            x, weight, scales, biases, transpose=True, group_size=group_size, bits=bits
        )
    return y if bias is None else y + bias
