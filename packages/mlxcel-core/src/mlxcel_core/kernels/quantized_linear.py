"""Linear layers over affine-quantized weights: a kernel for decode rows on a GPU and on an
x86-64 CPU, a dense tactic for prefill."""

from __future__ import annotations

import mlx.core as mx

from mlxcel_core.kernels import cpu_matvec
from mlxcel_core.kernels.quantized_matvec import (
    quantized_matvec_backend,
    quantized_matvec_kernel,
)
from mlxcel_core.kernels.stream_split import split_dequantized_product, split_quantized_product

# Rows up to which decode products take the matvec kernel. On an H100 (docs/benchmarks.md,
# a 14336x4096 4-bit weight) it took 32-35 us against MLX's 39 us at 1 row, 37 against 71 at
# 2 and 45 against 133 at 4, but 69-85 us against 34 at 8 rows, where MLX's own kernel
# changes tactic.
KERNEL_MAX_ROWS = 4


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
    cpu_streams: int = 1,
) -> mx.array:
    """`x @ W.T (+ bias)` for a weight W stored with MLX affine quantization.

    Four tactics, by the rows of x (all leading axes together):
    - where `quantized_matvec_backend` names a backend (a CUDA GPU; an Apple GPU with
      the Metal kernels on), up to `KERNEL_MAX_ROWS` rows (decode) of a supported
      layout: `quantized_matvec_kernel`, which reads each packed weight once;
    - at least `dequantize_min_rows` rows (a prefill chunk): W is dequantized once to x's
      dtype and multiplied as a dense matrix, a BLAS GEMM on the CPU and a cuBLAS one on
      CUDA, where MLX's `quantized_matmul` is several times slower at many rows;
    - on the CPU, where the C kernels are built (`cpu_matvec.available`), fewer rows, up
      to `cpu_matvec.MAX_ROWS`, of a layout it takes: `cpu_quantized_matvec`, several
      times faster than MLX's CPU product at decode rows;
    - otherwise `mx.quantized_matmul`, which reads 4-8x fewer bytes than a dense product.
    On the CPU, the dense tactic and `mx.quantized_matmul` split their output columns over
    `cpu_streams` streams, one core each (`mlxcel_core.kernels.stream_split`); the C
    kernel splits a large product's outputs over two threads (`cpu_matvec.threads_for`).

    Args:
        x: (..., K) activations, float.
        weight: (N, K * bits / 32) uint32 packed weight.
        scales: (N, K / group_size) per-group scales.
        biases: (N, K / group_size) per-group offsets.
        group_size: quantization group size (elements).
        bits: bits per element.
        bias: optional (N,) output bias.
        dequantize_min_rows: rows of x from which the dense tactic is used; None never
            uses it.
        cpu_streams: CPU streams the products are split over; 1 does not split.

    Returns:
        (..., N) in x's dtype.
    """
    rows = x.size // x.shape[-1]
    backend = None
    if rows <= KERNEL_MAX_ROWS:
        backend = quantized_matvec_backend(mx.default_device(), x.dtype, bits, group_size, rows)
    if backend is not None:
        y = quantized_matvec_kernel(
            x, weight, scales, biases, group_size=group_size, bits=bits, backend=backend
        )
    elif dequantize_min_rows is not None and rows >= dequantize_min_rows:
        y = split_dequantized_product(
            x, weight, scales, biases, group_size=group_size, bits=bits, num_streams=cpu_streams
        )
    elif _takes_cpu_kernel(x, scales, biases, bits, group_size):
        threads = cpu_matvec.threads_for(rows, weight.shape[0], x.shape[-1], cpu_streams)
        y = cpu_matvec.cpu_quantized_matvec(
            x, weight, scales, biases, group_size=group_size, bits=bits, threads=threads
        )
    else:
        y = split_quantized_product(
            x, weight, scales, biases, group_size=group_size, bits=bits, num_streams=cpu_streams
        )
    return y if bias is None else y + bias


def _takes_cpu_kernel(
    x: mx.array, scales: mx.array, biases: mx.array, bits: int, group_size: int
) -> bool:
    return (
        mx.default_device().type == mx.DeviceType.cpu
        and cpu_matvec.supports(x, scales, biases, bits, group_size)
        and cpu_matvec.available()
    )
