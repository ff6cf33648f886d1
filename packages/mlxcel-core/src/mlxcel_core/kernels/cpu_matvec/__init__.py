"""Affine-quantized weights times a few rows of float32 activations on the CPU, by a C
kernel that reads each packed weight once (docs/adr/0036-cpu-quantized-matvec.md).

MLX's CPU `quantized_matmul` costs about 0.75 ns per weight at one row on an x86-64 core;
this kernel, eight levels at a time in AVX2 lanes, about 0.1-0.2 ns. It runs outside MLX's
graph: the activations are evaluated, the product is computed into a NumPy buffer through
ctypes (the GIL released), and the result becomes a new MLX array. So it serves decode
rows, not functions under `mx.compile` or gradients.
"""

from __future__ import annotations

import ctypes

import mlx.core as mx
import numpy as np

from mlxcel_core.kernels.cpu_matvec.native import (
    c_buffer,
    describe_kernel,
    entry_point,
    native_library,
)

# The C arguments of `mlxcel_quantized_matvec`.
_ARGUMENTS = (ctypes.c_void_p,) * 5 + (ctypes.c_int,) * 6

# Rows of activations the kernel takes: decode batches.
MAX_ROWS = 8
BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)
# Products of at least this many weights (times rows) split their outputs over two threads:
# starting and joining one costs tens of microseconds, a few percent of such a product.
SPLIT_MIN_WEIGHTS = 4 * 2**20


def supports(x: mx.array, scales: mx.array, biases: mx.array, bits: int, group_size: int) -> bool:
    """Whether the kernel takes this product: float32 activations of at most `MAX_ROWS`
    rows, float32 scales and biases, 4 or 8 bits in groups of 32, 64 or 128."""
    rows = x.size // x.shape[-1]
    return (
        1 <= rows <= MAX_ROWS
        and x.dtype == mx.float32
        and scales.dtype == mx.float32
        and biases.dtype == mx.float32
        and bits in BITS
        and group_size in GROUP_SIZES
    )


def threads_for(rows: int, outputs: int, inputs: int, cpu_streams: int) -> int:
    """Threads for a product of `rows` rows and an (outputs, inputs) weight, where the
    caller may use `cpu_streams` cores: 2 from `SPLIT_MIN_WEIGHTS` on, else 1."""
    large = rows * outputs * inputs >= SPLIT_MIN_WEIGHTS
    return 2 if large and cpu_streams >= 2 else 1


def available() -> bool:
    """Whether the kernels' library is built and loaded in this process."""
    return native_library().library is not None


def describe_cpu_kernels() -> str:
    """One line saying whether decode products of quantized weights on the CPU run on the
    C kernel, or on MLX and why."""
    return describe_kernel("MLX's quantized_matmul")


def cpu_quantized_matvec(
    x: mx.array,
    weight: mx.array,
    scales: mx.array,
    biases: mx.array,
    *,
    group_size: int,
    bits: int,
    threads: int = 1,
) -> mx.array:
    """`x @ W.T` for a weight W in MLX's affine quantization, by the C kernel.

    Evaluates x (and the weight's arrays, if they are not yet).

    Args:
        x: (..., K) float32 activations, at most `MAX_ROWS` rows (all leading axes).
        weight: (N, K * bits / 32) uint32 packed levels.
        scales: (N, K / group_size) float32 per-group scales.
        biases: (N, K / group_size) float32 per-group offsets.
        group_size: 32, 64 or 128.
        bits: 4 or 8.
        threads: 1, or 2 to compute half of the outputs on a second thread.

    Returns:
        (..., N) float32, a new array.

    Raises:
        ValueError: a product `supports` refuses, shapes that disagree, or the library is
            not available (see `native.NativeLibrary.reason`).
    """
    if not supports(x, scales, biases, bits, group_size):
        raise ValueError(
            f"the CPU quantized matvec kernel takes at most {MAX_ROWS} rows of float32 "
            f"against float32 scales and biases, {BITS} bits, groups of {GROUP_SIZES}; got "
            f"{x.size // x.shape[-1]} rows of {x.dtype}, scales "
            f"{scales.dtype}, bits {bits}, group_size {group_size}"
        )
    K = x.shape[-1]
    N = weight.shape[0]
    M = x.size // K
    if weight.shape[1] * 32 != K * bits or scales.shape != (N, K // group_size):
        raise ValueError(
            f"x has {K} features but weight {weight.shape} and scales {scales.shape} "
            f"hold {weight.shape[1] * 32 // bits} at {bits} bits"
        )
    rows = x.reshape(M, K)
    mx.eval(rows, weight, scales, biases)
    y = np.empty((M, N), dtype=np.float32)
    pointers = [c_buffer(array) for array in (rows, weight, scales, biases)]
    status = entry_point("mlxcel_quantized_matvec", *_ARGUMENTS)(
        *(pointer for pointer, _ in pointers), y.ctypes.data, M, N, K, bits, group_size, threads
    )
    if status != 0:
        raise ValueError(
            f"the CPU quantized matvec kernel refused K={K}, group {group_size}, {threads} threads"
        )
    return mx.array(y).reshape(*x.shape[:-1], N)


__all__ = [
    "MAX_ROWS",
    "available",
    "cpu_quantized_matvec",
    "describe_cpu_kernels",
    "supports",
    "threads_for",
]
