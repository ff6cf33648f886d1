"""Compute tactics for the hot operations, each tested against its plain-MLX reference."""

from mlxcel_core.kernels.quantized_linear import quantized_linear

__all__ = ["quantized_linear"]
