"""Plain-MLX paths for the mlx-lm layers that run only as Metal kernels.

A few mlx-lm families compute some layers only through `mx.fast.metal_kernel`, with no
other path: BitNet's `BitLinear` (its ternary matmul) and Muse Spark's fused norms,
rotary embedding and expert routing (`mlx_lm.kernels`). mlxcel runs wherever MLX runs, so
on a device without Metal (Linux CPU, CUDA) `route_plain_kernels` rebinds the names those
families' Python modules call the kernels by to functions computing the same arithmetic
in plain MLX (tested against each kernel's source), as `cache_attention` rebinds
`scaled_dot_product_attention`. With Metal, mlx-lm's kernels run.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx_lm import kernels
from mlx_lm.models import bitlinear_layers

from mlxcel_models.plain_kernels import experts, norms
from mlxcel_models.plain_kernels.bitlinear import bitlinear_matmul

_PLAIN: tuple[tuple[object, Callable[..., object]], ...] = (
    (bitlinear_layers._bitlinear_kernel, bitlinear_matmul),
    (kernels.qk_norm, norms.qk_norm),
    (kernels.qk_norm_rope, norms.qk_norm_rope),
    (kernels.rms_norm_sigmoid_gate, norms.rms_norm_sigmoid_gate),
    (kernels.norm_add_norm, norms.norm_add_norm),
    (kernels.pre_norm, norms.pre_norm),
    (kernels.expert_routing, experts.expert_routing),
    (kernels.post_expert_norm_combine, experts.post_expert_norm_combine),
)
"""Each Metal-only mlx-lm kernel and its plain-MLX counterpart."""


def route_plain_kernels(module: nn.Module) -> None:
    """On a device without Metal, rebind every name bound to one of mlx-lm's Metal-only
    kernels in the Python module of a submodule class of `module` to its plain-MLX
    counterpart; with Metal, do nothing."""
    if mx.metal.is_available():
        return
    for name in {type(layer).__module__ for _, layer in module.named_modules()}:
        namespace = vars(sys.modules[name])
        for symbol, value in list(namespace.items()):
            for kernel, plain in _PLAIN:
                if value is kernel:
                    namespace[symbol] = plain


__all__ = ["route_plain_kernels"]
