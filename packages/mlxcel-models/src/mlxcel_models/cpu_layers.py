"""Dense linear layers and tied output projections with their products computed for the
CPU: `dense_linear`'s kernel at decode rows, else split over CPU streams
(`mlxcel_core.kernels.stream_split`).

Each class keeps its MLX parent's parameters and names, so anything that walks the model's
parameters (saving, adapters) sees no difference; only the product is computed otherwise.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from mlxcel_core.kernels.dense_linear import dense_linear
from mlxcel_core.kernels.quantized_linear import quantized_linear


class CpuLinear(nn.Linear):
    """An `nn.Linear` whose product is `dense_linear`'s, on up to `cpu_streams` cores."""

    cpu_streams: int

    @classmethod
    def replacing(cls, layer: nn.Linear, cpu_streams: int) -> CpuLinear:
        """A layer with `layer`'s parameters; the constructor's random init is replaced."""
        rows, columns = layer["weight"].shape
        replacement = cls(columns, rows, bias="bias" in layer)
        replacement.update(layer.parameters())
        replacement.cpu_streams = cpu_streams
        return replacement

    def __call__(self, x: mx.array) -> mx.array:
        y = dense_linear(x, self["weight"], cpu_streams=self.cpu_streams)
        return y if "bias" not in self else y + self["bias"]


class CpuEmbedding(nn.Embedding):
    """An `nn.Embedding` whose output projection (`as_linear`, tied weights) is
    `dense_linear`'s, on up to `cpu_streams` cores."""

    cpu_streams: int

    @classmethod
    def replacing(cls, layer: nn.Embedding, cpu_streams: int) -> CpuEmbedding:
        """A layer with `layer`'s parameters; the constructor's random init is replaced."""
        replacement = cls(*layer["weight"].shape)
        replacement.update(layer.parameters())
        replacement.cpu_streams = cpu_streams
        return replacement

    def as_linear(self, x: mx.array) -> mx.array:
        return dense_linear(x, self["weight"], cpu_streams=self.cpu_streams)


class CpuQuantizedEmbedding(nn.QuantizedEmbedding):
    """An affine `nn.QuantizedEmbedding` whose output projection (`as_linear`, tied
    weights) is `quantized_linear`'s: the CPU kernel at decode rows, else split over
    `cpu_streams` CPU streams."""

    cpu_streams: int

    @classmethod
    def replacing(cls, layer: nn.QuantizedEmbedding, cpu_streams: int) -> CpuQuantizedEmbedding:
        """A layer with `layer`'s parameters; the constructor's random init is replaced."""
        rows, packed = layer["weight"].shape
        replacement = cls(
            rows, packed * 32 // layer.bits, group_size=layer.group_size, bits=layer.bits
        )
        replacement.update(layer.parameters())
        replacement.cpu_streams = cpu_streams
        return replacement

    def as_linear(self, x: mx.array) -> mx.array:
        return quantized_linear(
            x,
            self["weight"],
            self["scales"],
            self["biases"],
            group_size=self.group_size,
            bits=self.bits,
            cpu_streams=self.cpu_streams,
        )


def apply_cpu_layers(module: nn.Module, cpu_streams: int) -> int:
    """Replace `module`'s dense linear layers and embeddings, and its affine-quantized
    embeddings, in place by their CPU forms; the number replaced.

    Quantized linear layers take their CPU products through `PrefillDequantizingLinear`.
    """
    kinds: dict[type, type] = {
        nn.Linear: CpuLinear,
        nn.Embedding: CpuEmbedding,
        nn.QuantizedEmbedding: CpuQuantizedEmbedding,
    }
    replacements = [
        (name, kinds[type(layer)].replacing(layer, cpu_streams))
        for name, layer in module.named_modules()
        if type(layer) in kinds
        and not (isinstance(layer, nn.QuantizedEmbedding) and layer.mode != "affine")
    ]
    module.update_modules(tree_unflatten(replacements))
    return len(replacements)
