"""A model's tensors by mlx-lm name, read and updated as float32 arrays.

Affine-quantized layers (`QuantizedLinear`, `QuantizedEmbedding`) show their weight as one
tensor, `NAME.weight`, dequantized on read; an update requantizes it with the layer's group
size and bits. Groups whose values the update leaves unchanged keep their packed values,
scales and biases exactly, so an edit of some rows or columns costs no precision elsewhere;
groups it changes are rounded to the quantization grid (zeros stay exact).
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlxcel_models.surgery.errors import SurgeryError


class ModelTensors:
    """The editable tensors of `module`, in parameter order.

    Args:
        module: an mlx-lm model; its weights may still be unevaluated.

    Raises:
        SurgeryError: a quantized layer uses a mode other than affine.
    """

    def __init__(self, module: nn.Module) -> None:
        self._modules = dict(module.named_modules())
        self._quantized: dict[str, nn.Module] = {}
        for name, layer in self._modules.items():
            if isinstance(layer, nn.QuantizedLinear | nn.QuantizedEmbedding):
                if layer.mode != "affine":
                    raise SurgeryError(
                        f"{name} is quantized in mode '{layer.mode}'; surgery edits only "
                        "float or affine-quantized weights"
                    )
                self._quantized[f"{name}.weight"] = layer
        hidden = {f"{name[: -len('.weight')]}.{part}" for name in self._quantized
                  for part in ("scales", "biases")}  # fmt: skip
        self._arrays = {
            name: array for name, array in tree_flatten(module.parameters()) if name not in hidden
        }

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._arrays)

    def __contains__(self, name: str) -> bool:
        return name in self._arrays

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's logical shape (a quantized weight's unpacked shape)."""
        layer = self._quantized.get(name)
        if layer is None:
            return tuple(self._arrays[name].shape)
        rows, packed = layer["weight"].shape
        return rows, packed * 32 // layer.bits

    def read(self, name: str) -> mx.array:
        """The tensor as float32 (dequantized if quantized); lazy."""
        layer = self._quantized.get(name)
        if layer is None:
            return self._arrays[name].astype(mx.float32)
        return mx.dequantize(
            layer["weight"],
            layer["scales"],
            layer["biases"],
            group_size=layer.group_size,
            bits=layer.bits,
        ).astype(mx.float32)

    def update(self, name: str, transform: Callable[[mx.array], mx.array]) -> None:
        """Set the tensor to `transform` of its float32 value (same shape, any float
        dtype), cast to the tensor's dtype or requantized."""
        before = self.read(name)
        value = transform(before)
        owner, _, attribute = name.rpartition(".")
        layer = self._quantized.get(name)
        if layer is None:
            self._modules[owner][attribute] = value.astype(self._arrays[name].dtype)
        else:
            _requantize(layer, value.astype(mx.float32), before)
        self._arrays[name] = self._modules[owner][attribute]


def _requantize(layer: nn.Module, value: mx.array, before: mx.array) -> None:
    weight, scales, biases = mx.quantize(
        value, group_size=layer.group_size, bits=layer.bits, mode="affine"
    )
    rows, groups = layer["scales"].shape
    changed = (value != before).reshape(rows, groups, -1).any(axis=-1)
    packed = layer["weight"]
    layer["weight"] = mx.where(
        changed[..., None], weight.reshape(rows, groups, -1), packed.reshape(rows, groups, -1)
    ).reshape(packed.shape)
    dtype = layer["scales"].dtype
    layer["scales"] = mx.where(changed, scales.astype(dtype), layer["scales"])
    layer["biases"] = mx.where(changed, biases.astype(dtype), layer["biases"])
