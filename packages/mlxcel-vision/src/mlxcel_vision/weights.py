"""Reading a vision-language folder's safetensors into a module, strictly."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten

from mlxcel_models.compute import ComputeOptions, apply_compute_options
from mlxcel_models.errors import ModelLoadError


def read_safetensors(folder: Path) -> dict[str, mx.array]:
    """Every tensor of the folder's `model*.safetensors` files, by name, not yet read.

    Raises:
        ModelLoadError: there is no such file, or one is unreadable.
    """
    files = sorted(folder.glob("model*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} holds no model*.safetensors weights")
    weights: dict[str, mx.array] = {}
    for file in files:
        try:
            weights.update(mx.load(str(file)))
        except (RuntimeError, OSError, ValueError) as error:
            raise ModelLoadError(f"{file}: cannot read the weights: {error}") from error
    return weights


def _quantization(path: str, layer: nn.Module, weights: dict[str, mx.array]) -> dict | bool:
    """The affine settings a layer stored quantized (mlx-lm / mlx-vlm format) was packed
    with, read off its tensors' shapes; False for a layer stored as floats."""
    scales = weights.get(f"{path}.scales")
    if scales is None or not isinstance(layer, nn.Linear | nn.Embedding):
        return False
    columns = layer.weight.shape[-1]
    return {
        "group_size": columns // scales.shape[-1],
        "bits": weights[f"{path}.weight"].shape[-1] * 32 // columns,
    }


def load_module_weights(
    module: nn.Module, weights: dict[str, mx.array], where: Path, compute: ComputeOptions
) -> None:
    """Load `weights` (named as `module`'s parameters) into `module`, then apply `compute`.

    Layers stored quantized are made quantized first. The weights are not evaluated.

    Raises:
        ModelLoadError: a parameter has no tensor, a tensor matches no parameter, or a
            tensor's shape differs from its parameter's; the message names the tensor.
    """
    nn.quantize(module, class_predicate=lambda path, layer: _quantization(path, layer, weights))
    expected = dict(tree_flatten(module.parameters()))
    missing = sorted(expected.keys() - weights.keys())
    if missing:
        raise ModelLoadError(f"{where}: the weights lack {_listed(missing)}")
    unexpected = sorted(weights.keys() - expected.keys())
    if unexpected:
        raise ModelLoadError(f"{where}: unexpected tensor {_listed(unexpected)}")
    for name, parameter in expected.items():
        if weights[name].shape != parameter.shape:
            raise ModelLoadError(
                f"{where}: tensor {name} has shape {tuple(weights[name].shape)}, "
                f"the model expects {tuple(parameter.shape)}"
            )
    module.update(tree_unflatten(list(weights.items())))
    apply_compute_options(module, compute)


def _listed(names: list[str]) -> str:
    more = f" and {len(names) - 1} more" if len(names) > 1 else ""
    return f"{names[0]}{more}"
