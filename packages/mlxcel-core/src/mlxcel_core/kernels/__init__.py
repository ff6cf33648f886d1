"""Compute tactics for the hot operations, each tested against its plain-MLX reference."""

from mlxcel_core.kernels.paged_attention import paged_decode_attention
from mlxcel_core.kernels.quantized_linear import quantized_linear

__all__ = ["paged_decode_attention", "quantized_linear"]
