"""How a loaded model computes: activation dtype and the prefill tactic for quantized layers."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map, tree_unflatten

from mlxcel_core.kernels import quantized_linear

# Rows of input from which quantized layers dequantize for a dense GEMM (prefill chunks).
CPU_DEQUANTIZE_MIN_ROWS = 4


@dataclass(frozen=True)
class ComputeOptions:
    """Per-device choices applied to a model after its weights are read.

    Attributes:
        float_dtype: dtype for the float parameters (norms, quantization scales and biases,
            unquantized weights), which sets the activations' dtype; None keeps the file's.
        dequantize_min_rows: quantized linear layers given at least this many rows of input
            multiply by their dequantized weight (see `quantized_linear`); None never does.
    """

    float_dtype: mx.Dtype | None = None
    dequantize_min_rows: int | None = None

    def __post_init__(self) -> None:
        if self.dequantize_min_rows is not None and self.dequantize_min_rows < 1:
            raise ValueError(f"dequantize_min_rows must be >= 1, got {self.dequantize_min_rows}")

    @classmethod
    def for_device(cls, device: mx.Device) -> ComputeOptions:
        """The measured best choice for `device` (docs/adr/0003).

        On the CPU, float16 arithmetic has no fast path and quantized GEMMs skip BLAS, so
        activations run in float32 and prefill dequantizes. Elsewhere the file's dtypes and
        MLX's quantized kernels are kept.
        """
        if device.type == mx.DeviceType.cpu:
            return cls(float_dtype=mx.float32, dequantize_min_rows=CPU_DEQUANTIZE_MIN_ROWS)
        return cls()


class PrefillDequantizingLinear(nn.QuantizedLinear):
    """An affine `QuantizedLinear` that switches to a dense product for long inputs.

    Parameters and their names are those of `nn.QuantizedLinear`, so anything that walks
    the model's parameters (saving, adapters) sees no difference.
    """

    dequantize_min_rows: int

    @classmethod
    def replacing(cls, layer: nn.QuantizedLinear, min_rows: int) -> PrefillDequantizingLinear:
        """A layer with `layer`'s parameters; the constructor's random init is never run."""
        input_dims = layer.weight.shape[1] * 32 // layer.bits
        replacement = cls(
            input_dims,
            layer.weight.shape[0],
            bias="bias" in layer,
            group_size=layer.group_size,
            bits=layer.bits,
        )
        replacement.update(layer.parameters())
        replacement.dequantize_min_rows = min_rows
        return replacement

    def __call__(self, x: mx.array) -> mx.array:
        return quantized_linear(
            x,
            self["weight"],
            self["scales"],
            self["biases"],
            group_size=self.group_size,
            bits=self.bits,
            bias=self.get("bias"),
            dequantize_min_rows=self.dequantize_min_rows,
        )


def apply_compute_options(module: nn.Module, options: ComputeOptions) -> None:
    """Cast float parameters and install the prefill tactic, in place, before evaluation."""
    if options.float_dtype is not None:
        dtype = options.float_dtype
        module.update(
            tree_map(
                lambda a: a.astype(dtype) if mx.issubdtype(a.dtype, mx.floating) else a,
                module.parameters(),
            )
        )
    if options.dequantize_min_rows is not None:
        replacements = [
            (name, PrefillDequantizingLinear.replacing(layer, options.dequantize_min_rows))
            for name, layer in module.named_modules()
            if type(layer) is nn.QuantizedLinear and layer.mode == "affine"
        ]
        module.update_modules(tree_unflatten(replacements))
