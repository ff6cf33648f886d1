"""Which backend's kernels serve a device, and the option that lets Metal's run.

The CUDA kernels run on every CUDA GPU. The Metal kernels are the same sources spelled
for Metal (`backend.py`) but are not yet verified on Apple hardware, so on an Apple GPU
the plain-MLX references run unless `KernelOptions.metal_kernels` is on (docs/
metal-kernels.md). Libraries do not read the environment: a command builds its
`KernelOptions` from what it was given (`MLXCEL_METAL_KERNELS=1`) and installs them for
the kernels' callers, which run deep inside a model's forward pass, the KV cache and the
sampler with no caller to hand them settings. Until then the Metal kernels are off.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import mlx.core as mx

from mlxcel_core.kernels.backend import CUDA, METAL, Backend


@dataclass(frozen=True)
class KernelOptions:
    """Choices about the custom kernels, made by the command that runs a model.

    Attributes:
        metal_kernels: run the Metal kernels on an Apple GPU where they take a layer,
            instead of the plain-MLX references; not yet verified on Apple hardware.
    """

    metal_kernels: bool = False


_installed = KernelOptions()


def install_kernel_options(options: KernelOptions) -> None:
    """Make `options` the process's, for every later `kernel_backend`."""
    global _installed
    _installed = options


def installed_kernel_options() -> KernelOptions:
    """The options last installed; the defaults (Metal kernels off) before any."""
    return _installed


@functools.cache
def _cuda_available() -> bool:
    return mx.cuda.is_available()


@functools.cache
def _metal_available() -> bool:
    return mx.metal.is_available()


def kernel_backend(device: mx.Device) -> Backend | None:
    """The backend whose kernels serve `device`: `CUDA` on a GPU whose backend is CUDA,
    `METAL` on an Apple GPU when the installed options turn the Metal kernels on, None
    elsewhere (the CPU, or an Apple GPU without them), where the references run."""
    if device.type != mx.DeviceType.gpu:
        return None
    if _cuda_available():
        return CUDA
    if _installed.metal_kernels and _metal_available():
        return METAL
    return None
