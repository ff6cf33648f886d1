"""Affine-quantized weights times a few rows of activations, reading each weight once.

`uses_quantized_matvec_kernel` says where `quantized_matvec_cuda` serves a product (a CUDA
GPU, 1-8 rows, 4- or 8-bit weights in groups of 32, 64 or 128); `mx.quantized_matmul` is
the reference it is tested against and the path everywhere else
(docs/adr/0020-quantized-matvec-kernel.md). `quantized_matvec_metal` is its Metal port,
untested on hardware, to which nothing dispatches.
"""

from __future__ import annotations

import functools

import mlx.core as mx

from mlxcel_core.kernels.quantized_matvec.cuda import (
    MAX_ROWS,
    quantized_matvec_cuda,
    supports,
)
from mlxcel_core.kernels.quantized_matvec.metal import quantized_matvec_metal


@functools.cache
def _cuda_available() -> bool:
    return mx.cuda.is_available()


def uses_quantized_matvec_kernel(
    device: mx.Device, dtype: mx.Dtype, bits: int, group_size: int, num_rows: int
) -> bool:
    """Whether `quantized_matvec_cuda` serves `num_rows` rows of `dtype` activations
    against a weight of `bits` and `group_size` on `device`: a GPU whose backend is CUDA,
    and a product the kernel supports."""
    return (
        device.type == mx.DeviceType.gpu
        and _cuda_available()
        and supports(dtype, bits, group_size, num_rows)
    )


__all__ = [
    "MAX_ROWS",
    "quantized_matvec_cuda",
    "quantized_matvec_metal",
    "supports",
    "uses_quantized_matvec_kernel",
]
