"""Compute tactics for the hot operations, each tested against its plain-MLX reference.

Each kernel is one source for CUDA and Metal (`backend`); `options.kernel_backend` says
which backend's kernels serve a device.
"""

from mlxcel_core.kernels.backend import BACKENDS, CUDA, METAL, Backend
from mlxcel_core.kernels.options import (
    KernelOptions,
    install_kernel_options,
    installed_kernel_options,
    kernel_backend,
)
from mlxcel_core.kernels.paged_attention import paged_decode_attention
from mlxcel_core.kernels.quantized_linear import quantized_linear

__all__ = [
    "BACKENDS",
    "CUDA",
    "METAL",
    "Backend",
    "KernelOptions",
    "install_kernel_options",
    "installed_kernel_options",
    "kernel_backend",
    "paged_decode_attention",
    "quantized_linear",
]
