"""Affine-quantized weights times a few rows of activations, reading each weight once.

`quantized_matvec_backend` names the backend whose `quantized_matvec_kernel` serves a
product (1-8 rows, 4- or 8-bit weights in groups of 32, 64 or 128); `mx.quantized_matmul`
is the reference it is tested against and the path everywhere else
(docs/adr/0020-quantized-matvec-kernel.md). The kernel is one source for CUDA and Metal;
the Metal one runs only when the installed `KernelOptions` turn it on.
"""

from __future__ import annotations

import mlx.core as mx

from mlxcel_core.kernels.backend import Backend
from mlxcel_core.kernels.options import kernel_backend
from mlxcel_core.kernels.quantized_matvec.kernel import (
    MAX_ROWS,
    quantized_matvec_kernel,
    supports,
)


def quantized_matvec_backend(
    device: mx.Device, dtype: mx.Dtype, bits: int, group_size: int, num_rows: int
) -> Backend | None:
    """The backend whose kernel serves `num_rows` rows of `dtype` activations against a
    weight of `bits` and `group_size` on `device` (`kernel_backend`'s, for a product the
    kernel supports), or None."""
    if not supports(dtype, bits, group_size, num_rows):
        return None
    return kernel_backend(device)


__all__ = [
    "MAX_ROWS",
    "quantized_matvec_backend",
    "quantized_matvec_kernel",
    "supports",
]
