"""Gumbel-max sampling: one token per row from softmax(logits / T), with per-row Philox
keys, as one fused kernel.

`uses_gumbel_kernel` says whether the CUDA kernel serves the default device; the sampler
(`mlxcel_core.sampling.sampler`) then makes its final draw with it, and with
`mx.random.categorical` everywhere else (docs/adr/0018-gumbel-max-sampling-kernel.md).
The Metal variant is written but untested on hardware, and nothing dispatches to it.
"""

from __future__ import annotations

import mlx.core as mx

from mlxcel_core.kernels.gumbel_sampling.cuda import gumbel_max_sample_cuda
from mlxcel_core.kernels.gumbel_sampling.metal import gumbel_max_sample_metal
from mlxcel_core.kernels.gumbel_sampling.philox import philox4x32_10, token_uniforms
from mlxcel_core.kernels.gumbel_sampling.reference import gumbel_max_sample_reference


def uses_gumbel_kernel(device: mx.Device) -> bool:
    """Whether the sampler's final draw runs the CUDA kernel on `device`: a GPU whose
    backend is CUDA."""
    return device.type == mx.DeviceType.gpu and mx.cuda.is_available()


__all__ = [
    "gumbel_max_sample_cuda",
    "gumbel_max_sample_metal",
    "gumbel_max_sample_reference",
    "philox4x32_10",
    "token_uniforms",
    "uses_gumbel_kernel",
]
