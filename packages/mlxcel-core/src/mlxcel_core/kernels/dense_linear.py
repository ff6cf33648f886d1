"""Linear layers over dense weights on the CPU: a kernel for decode rows, BLAS otherwise."""

from __future__ import annotations

import mlx.core as mx

from mlxcel_core.kernels import cpu_matvec
from mlxcel_core.kernels.cpu_matvec import dense
from mlxcel_core.kernels.stream_split import split_dense_product

# Rows from which the kernel is used. It makes the forward pass wait for its input, so the
# host stops building the rest of the step while the product computes; at one row that
# costs more than the kernel saves. Measured on a 2-core Xeon with SmolLM2 float32 through
# the engine (docs/adr/0039-cpu-dense-matvec.md): one row 12.8-14.1 tok/s with the kernel
# against 16.4-18.3 without, four rows 45.5 against 42.7.
KERNEL_MIN_ROWS = 2


def dense_linear(x: mx.array, weight: mx.array, *, cpu_streams: int = 1) -> mx.array:
    """`x @ weight.T`.

    Two tactics, by the rows of x (all leading axes together):
    - on the CPU, where the C kernels are built, float32 products of `KERNEL_MIN_ROWS` to
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
    rows = x.size // x.shape[-1]
    if rows >= KERNEL_MIN_ROWS and dense.supports(x, weight) and cpu_matvec.available():
        threads = dense.threads_for(rows, weight.shape[0], weight.shape[1], cpu_streams)
        return dense.cpu_dense_matvec(x, weight, threads=threads)
    return split_dense_product(x, weight, cpu_streams)
