"""Compute tactics for the hot operations, each tested against its plain-MLX reference."""

from mlxcel_core.kernels.paged_attention import paged_decode_attention
from mlxcel_core.kernels.quantized_linear import quantized_linear
from mlxcel_core.kernels.turbo_encode_metal import turbo_encode_metal

__all__ = ["paged_decode_attention", "quantized_linear", "turbo_encode_metal"]
