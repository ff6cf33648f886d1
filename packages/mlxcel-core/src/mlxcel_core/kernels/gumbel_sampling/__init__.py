"""Gumbel-max sampling: one token per row from softmax(logits / T), with per-row Philox
keys, as one fused kernel.

Where `kernel_backend` names a backend for the default device, the sampler
(`mlxcel_core.sampling.sampler`) makes its final draw with `gumbel_max_sample_kernel`,
and with `mx.random.categorical` everywhere else
(docs/adr/0018-gumbel-max-sampling-kernel.md). The kernel is one source for CUDA and
Metal; the Metal one runs only when the installed `KernelOptions` turn it on.
"""

from __future__ import annotations

from mlxcel_core.kernels.gumbel_sampling.kernel import gumbel_max_sample_kernel
from mlxcel_core.kernels.gumbel_sampling.philox import philox4x32_10, token_uniforms
from mlxcel_core.kernels.gumbel_sampling.reference import gumbel_max_sample_reference

__all__ = [
    "gumbel_max_sample_kernel",
    "gumbel_max_sample_reference",
    "philox4x32_10",
    "token_uniforms",
]
