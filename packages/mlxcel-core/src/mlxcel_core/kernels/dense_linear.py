"""Linear layers over dense weights on the CPU: a kernel for decode rows, BLAS otherwise."""

from __future__ import annotations

import mlx.core as mx

from mlxcel_core.kernels import cpu_matvec
from mlxcel_core.kernels.cpu_matvec import dense
from mlxcel_core.kernels.stream_split import split_dense_product


def dense_linear(x: mx.array, weight: mx.array, *, cpu_streams: int = 1) -> mx.array:
    """`x @ weight.T`.

    Two tactics, by the rows of x (all leading axes together):
    - on the CPU, where the C kernels are built, float32 products of `dense.MIN_ROWS` to
      `dense.MAX_ROWS` rows (decode): `cpu_dense_matvec`, which reads each weight once
      instead of packing it for a GEMM, its outputs over two threads when the product is
      large (`dense.threads_for`);
    - otherwise MLX's `matmul` (a BLAS GEMM on the CPU), its output columns split over
      `cpu_streams` streams, one core each (`mlxcel_core.kernels.stream_split`).

    Args:
        x: (..., K) float activations.
        weight: (N, K) dense weight of x's dtype.
        cpu_streams: CPU cores the product may use; 1 does not split.

    Returns:
        (..., N) in x's dtype.
    """
    if dense.supports(x, weight) and cpu_matvec.available():
        rows = x.size // x.shape[-1]
        threads = dense.threads_for(rows, weight.shape[0], weight.shape[1], cpu_streams)
        return dense.cpu_dense_matvec(x, weight, threads=threads)
    return split_dense_product(x, weight, cpu_streams)
