"""Linear layers with LoRA updates: unfused with per-row scales, or fused into the weight."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn

from mlxcel_models.compute import PrefillDequantizingLinear


class RowScales:
    """The adapter scales of the next forward pass, shared by every `LoraLinear` of a model.

    Attributes:
        scales: (B, A) or (1, A) scales, one row per batch row (or one for all rows), one
            column per adapter, in the model's float dtype.
        all_zero: every scale is 0: the layers skip their low-rank products.
    """

    def __init__(self, num_adapters: int, dtype: mx.Dtype) -> None:
        self.dtype = dtype
        self.scales = mx.array([[0.0] * num_adapters], dtype=dtype)
        self.all_zero = True

    def set(self, rows: Sequence[Sequence[float]]) -> None:
        """Set (B, A) scales; identical rows are kept as one broadcast row.

        Raises:
            ValueError: `rows` is empty or a row's length is not the number of adapters.
        """
        num_adapters = self.scales.shape[1]
        if not rows or any(len(row) != num_adapters for row in rows):
            raise ValueError(
                f"rows must hold at least one row of {num_adapters} scales, got {list(rows)}"
            )
        distinct = [rows[0]] if all(row == rows[0] for row in rows) else list(rows)
        self.scales = mx.array(distinct, dtype=self.dtype)
        self.all_zero = not any(scale != 0 for row in distinct for scale in row)


def input_dims(layer: nn.Module) -> int:
    """Columns of a linear layer's weight, unpacking quantized ones."""
    columns = layer["weight"].shape[1]
    return columns * 32 // layer.bits if isinstance(layer, nn.QuantizedLinear) else columns


class LoraLinear(nn.Module):
    """A linear layer plus the low-rank updates of several adapters, scaled per batch row.

    y[b] = base(x[b]) + Σ_a s[b, a] · (x[b] @ A_a) @ B_a, computed as one product over the
    adapters' concatenated ranks: ((x @ A) * s[:, adapter of each rank column]) @ B.

    Args:
        base: the `nn.Linear` or `nn.QuantizedLinear` being adapted.
        lora_a: (in, R) the adapters' down projections side by side, R their summed ranks.
        lora_b: (R, out) their up projections stacked, each pre-multiplied by its adapter's
            own scale.
        columns: (R,) int32, the adapter index of each rank column.
        row_scales: the model's shared runtime scales.
    """

    def __init__(
        self,
        base: nn.Module,
        lora_a: mx.array,
        lora_b: mx.array,
        columns: mx.array,
        row_scales: RowScales,
    ) -> None:
        super().__init__()
        self.base = base
        self.lora_a = lora_a
        self.lora_b = lora_b
        self._columns = columns
        self._row_scales = row_scales

    def __call__(self, x: mx.array) -> mx.array:
        y = self.base(x)
        if self._row_scales.all_zero:
            return y
        scales = mx.take(self._row_scales.scales, self._columns, axis=1)
        low_rank = (x @ self.lora_a) * scales[:, None, :]
        return y + low_rank @ self.lora_b


def fuse_linear(layer: nn.Module, delta: mx.array) -> nn.Module:
    """`layer` with `delta` added to its weight; a quantized layer is requantized alike.

    Follows mlx-lm's `LoRALinear.fuse`: a quantized weight is dequantized, updated and
    quantized again with its group size and bits, which adds its own rounding error.

    Args:
        layer: an `nn.Linear`, `nn.QuantizedLinear` or `PrefillDequantizingLinear`.
        delta: (out, in) float update.
    """
    if not isinstance(layer, nn.QuantizedLinear):
        fused = nn.Linear(input_dims(layer), layer["weight"].shape[0], bias="bias" in layer)
        fused.update(layer.parameters())
        fused.weight = layer["weight"] + delta.astype(layer["weight"].dtype)
        return fused
    dtype = layer["scales"].dtype
    weight = mx.dequantize(
        layer["weight"],
        layer["scales"],
        layer["biases"],
        group_size=layer.group_size,
        bits=layer.bits,
    )
    dense = nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in layer)
    dense.weight = (weight + delta).astype(dtype)
    if "bias" in layer:
        dense.bias = layer["bias"]
    fused = nn.QuantizedLinear.from_linear(dense, layer.group_size, layer.bits)
    if isinstance(layer, PrefillDequantizingLinear):
        return PrefillDequantizingLinear.replacing(
            fused, layer.dequantize_min_rows, layer.cpu_streams
        )
    return fused
