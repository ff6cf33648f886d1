"""The custom kernels built anew, through a stand-in for MLX's kernel builder, while a test
runs: every kernel module's cache of built kernels is cleared on the way in and out."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import mlx.core as mx

from mlxcel_core.kernels import Backend, turbo_encode
from mlxcel_core.kernels.gumbel_sampling import kernel as gumbel_kernel
from mlxcel_core.kernels.paged_attention import decode, turbo
from mlxcel_core.kernels.quantized_matvec import kernel as matvec_kernel

KERNEL_CACHES = (
    decode.kernels,
    turbo.kernels,
    turbo_encode.kernels,
    matvec_kernel.kernel,
    gumbel_kernel.kernel,
)


@contextlib.contextmanager
def kernels_built_by(monkeypatch, backend: Backend, build: Callable[..., object]) -> Iterator[None]:
    """`backend`'s kernels built through `build` (standing in for `mx.fast.cuda_kernel` or
    `mx.fast.metal_kernel`) inside the block."""
    monkeypatch.setattr(mx.fast, backend.builder, build)
    for cache in KERNEL_CACHES:
        cache.cache_clear()
    yield
    for cache in KERNEL_CACHES:
        cache.cache_clear()
