"""Attaching LoRA adapters to a loaded model.

Unfused, every adapted linear layer becomes a `LoraLinear` whose update is scaled per row of
the batch, so requests with different scales share a forward pass. Fused, the scaled
updates are added into the weights once and cost nothing per token, but the scales are
fixed from then on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from mlxcel_core.adapters import AdapterScales
from mlxcel_models.loaded import LoadedModel
from mlxcel_models.lora.adapters import AdapterInfo, AdapterSpec, LoraAdapters
from mlxcel_models.lora.errors import AdapterLoadError
from mlxcel_models.lora.formats import AdapterFile, LoraWeights, read_adapter
from mlxcel_models.lora.layer import LoraLinear, RowScales, fuse_linear, input_dims


def _float_dtype(layer: nn.Module) -> mx.Dtype:
    return layer["scales"].dtype if isinstance(layer, nn.QuantizedLinear) else layer.weight.dtype


def _check_fits(
    adapter: AdapterFile, module: str, layer: nn.Module | None, update: LoraWeights
) -> None:
    if not isinstance(layer, nn.Linear | nn.QuantizedLinear):
        raise AdapterLoadError(
            f"LoRA adapter {adapter.path}: tensor {update.a_name} matches no linear layer "
            f"of the model (no {module})"
        )
    if update.a.shape[0] != input_dims(layer):
        raise AdapterLoadError(
            f"LoRA adapter {adapter.path}: tensor {update.a_name} has shape "
            f"{tuple(update.a.shape)}, which does not fit {module} ({input_dims(layer)} inputs)"
        )
    outputs = layer["weight"].shape[0]
    if update.b.shape[1] != outputs:
        raise AdapterLoadError(
            f"LoRA adapter {adapter.path}: tensor {update.b_name} has shape "
            f"{tuple(update.b.shape)}, which does not fit {module} ({outputs} outputs)"
        )


_Updates = dict[str, list[tuple[int, LoraWeights]]]
"""Module path → (adapter id, that adapter's update of the module), for every adapted module."""


def _read_all(
    layers: Mapping[str, nn.Module], specs: Sequence[AdapterSpec]
) -> tuple[list[AdapterFile], _Updates]:
    """Every adapter, each update checked against the model's layer it names."""
    files = [read_adapter(spec.path) for spec in specs]
    by_module: _Updates = {}
    for adapter_id, adapter in enumerate(files):
        for name, update in adapter.layers.items():
            _check_fits(adapter, name, layers.get(name), update)
            by_module.setdefault(name, []).append((adapter_id, update))
    return files, by_module


def _fused_layers(
    layers: Mapping[str, nn.Module], by_module: _Updates, scales: AdapterScales
) -> list[tuple[str, nn.Module]]:
    replacements = []
    for name, updates in by_module.items():
        delta = sum(
            scales[i] * update.scale * (update.a.astype(mx.float32) @ update.b).T
            for i, update in updates
        )
        replacements.append((name, fuse_linear(layers[name], delta)))
    return replacements


def _unfused_layers(
    layers: Mapping[str, nn.Module], by_module: _Updates, row_scales: RowScales
) -> list[tuple[str, nn.Module]]:
    replacements = []
    for name, updates in by_module.items():
        dtype = _float_dtype(layers[name])
        lora_a = mx.concatenate([update.a for _, update in updates], axis=1).astype(dtype)
        lora_b = mx.concatenate([update.b * update.scale for _, update in updates], axis=0)
        # Built from a list, not by MLX ops: nothing left to evaluate on this thread.
        columns = mx.array(
            [i for i, update in updates for _ in range(update.a.shape[1])], dtype=mx.int32
        )
        layer = LoraLinear(layers[name], lora_a, lora_b.astype(dtype), columns, row_scales)
        replacements.append((name, layer))
    return replacements


def apply_adapters(
    loaded: LoadedModel, specs: Sequence[AdapterSpec], *, fuse: bool = False
) -> LoadedModel:
    """Attach adapters to `loaded`'s model in place; return it with `adapters` set.

    Unfused, the adapters' updates are computed beside the base layers at the scales set
    per request (see `LoraAdapters`); fused, `Σ scale · A B` is added into each weight (a
    quantized weight is requantized, as mlx-lm's fuse does).

    Args:
        loaded: a model whose family supports adapters.
        specs: the adapters, in id order, with their starting global scales; none
            leaves `loaded` as it is.
        fuse: bake the starting scales into the weights.

    Raises:
        AdapterLoadError: the model's family takes no adapters, or an adapter is missing,
            unreadable, or has a tensor that matches no layer or does not fit it.
    """
    if not specs:
        return loaded
    if not loaded.family.supports_adapters:
        raise AdapterLoadError(f"{loaded.family.model_type} models do not support LoRA adapters")
    module = loaded.model.module
    layers = dict(module.named_modules())
    files, by_module = _read_all(layers, specs)
    scales = tuple(spec.scale for spec in specs)
    if fuse:
        row_scales = None
        replacements = _fused_layers(layers, by_module, scales)
    else:
        row_scales = RowScales(len(specs), _float_dtype(layers[next(iter(by_module))]))
        replacements = _unfused_layers(layers, by_module, row_scales)
    module.update_modules(tree_unflatten(replacements))
    mx.eval(module.parameters())
    infos = tuple(
        AdapterInfo(i, spec.path, adapter.format, len(adapter.layers))
        for i, (spec, adapter) in enumerate(zip(specs, files, strict=True))
    )
    return replace(loaded, adapters=LoraAdapters(infos, scales, row_scales))
