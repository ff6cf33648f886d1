"""Dense float32 weights times a few rows of float32 activations on the CPU, by a C kernel
that reads each weight from memory once (dense_matvec.c; docs/adr/0039-cpu-dense-matvec.md).

A BLAS GEMM packs the whole weight into its own layout on every call; at decode's few rows
that copy is most of the product (OpenBLAS's `sgemm_incopy` took 35% of a 16-row SmolLM2
decode step, its arithmetic 16%). Like `cpu_quantized_matvec`, the kernel runs outside
MLX's graph: the activations are evaluated, the product is computed into a NumPy buffer
through ctypes (the GIL released), and the result becomes a new MLX array. So it serves
forward passes, not functions under `mx.compile` or gradients.
"""

from __future__ import annotations

import ctypes

import mlx.core as mx
import numpy as np

from mlxcel_core.kernels.cpu_matvec.native import (
    c_buffer,
    describe_kernel,
    entry_point,
)

# The C arguments of `mlxcel_dense_matvec`.
_ARGUMENTS = (ctypes.c_void_p,) * 3 + (ctypes.c_int64,) * 3 + (ctypes.c_int,)

# Rows of activations the kernel takes. Measured on a 2-core Xeon with SmolLM2's layer
# products and tied output projection, float32 (docs/adr/0039): at 16 rows the kernel took
# 68 ms against OpenBLAS's 88 ms split over two streams; at 32 rows 95 against 106 ms.
MAX_ROWS = 32
# Products of at least this many multiply-adds split their outputs over two threads:
# starting and joining one costs tens of microseconds.
SPLIT_MIN_MULTIPLY_ADDS = 2**20


def supports(x: mx.array, weight: mx.array) -> bool:
    """Whether the kernel takes `x @ weight.T`: float32 activations of 1 to `MAX_ROWS` rows
    and a float32 (N, K) weight, with the CPU as the default device."""
    rows = x.size // x.shape[-1] if x.ndim else 0
    return (
        1 <= rows <= MAX_ROWS
        and x.dtype == mx.float32
        and weight.dtype == mx.float32
        and weight.ndim == 2
        and mx.default_device().type == mx.DeviceType.cpu
    )


def threads_for(rows: int, outputs: int, inputs: int, cpu_streams: int) -> int:
    """Threads for a product of `rows` rows and an (outputs, inputs) weight, where the
    caller may use `cpu_streams` cores: 2 from `SPLIT_MIN_MULTIPLY_ADDS` on, else 1."""
    large = rows * outputs * inputs >= SPLIT_MIN_MULTIPLY_ADDS
    return 2 if large and cpu_streams >= 2 else 1


def describe_cpu_dense_products() -> str:
    """One line saying whether decode products of dense float32 weights on the CPU run on
    the C kernel, or on MLX's BLAS product and why."""
    return describe_kernel("MLX's matmul")


def cpu_dense_matvec(x: mx.array, weight: mx.array, *, threads: int = 1) -> mx.array:
    """`x @ weight.T` by the C kernel.

    Evaluates x (and the weight, if it is not yet). Each output is summed over K in eight
    float32 lanes, in order, then across the lanes: a row's result does not depend on the
    other rows or on `threads` (within float32 rounding of a BLAS product: about 1e-6
    relative at K in the thousands).

    Args:
        x: (..., K) float32 activations, 1 to `MAX_ROWS` rows (all leading axes).
        weight: (N, K) float32.
        threads: 1, or 2 to compute half of the outputs on a second thread.

    Returns:
        (..., N) float32, a new array.

    Raises:
        ValueError: a product `supports` refuses, shapes that disagree, `threads` other
            than 1 and 2, or the library is not available (see `native.NativeLibrary.reason`).
    """
    if not supports(x, weight):
        raise ValueError(
            f"the CPU dense matvec kernel takes 1 to {MAX_ROWS} rows of float32 "
            f"against a float32 2-D weight on the CPU; got {x.size // max(x.shape[-1], 1)} "
            f"rows of {x.dtype}, weight {weight.dtype} {weight.shape} on {mx.default_device()}"
        )
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"x has {x.shape[-1]} features but the weight {weight.shape} takes {weight.shape[1]}"
        )
    if threads not in (1, 2):
        raise ValueError(f"threads must be 1 or 2, got {threads}")
    K = x.shape[-1]
    N = weight.shape[0]
    M = x.size // K
    rows = x.reshape(M, K)
    mx.eval(rows, weight)
    y = np.empty((M, N), dtype=np.float32)
    (x_pointer, _x_held), (w_pointer, _w_held) = c_buffer(rows), c_buffer(weight)
    entry_point("mlxcel_dense_matvec", *_ARGUMENTS)(
        x_pointer, w_pointer, y.ctypes.data, M, N, K, threads
    )
    return mx.array(y).reshape(*x.shape[:-1], N)


__all__ = [
    "MAX_ROWS",
    "cpu_dense_matvec",
    "describe_cpu_dense_products",
    "supports",
    "threads_for",
]
