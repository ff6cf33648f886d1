"""Attaching LoRA adapters to a loaded model, and their scales at run time.

Unfused, every adapted linear layer becomes a `LoraLinear` whose update is scaled per row of
the batch, so requests with different scales share a forward pass. Fused, the scaled
updates are added into the weights once and cost nothing per token, but the scales are
fixed from then on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from mlxcel_core.adapters import AdapterScales
from mlxcel_models.loaded import LoadedModel
from mlxcel_models.lora.errors import AdapterLoadError
from mlxcel_models.lora.formats import AdapterFile, AdapterFormat, LoraWeights, read_adapter
from mlxcel_models.lora.layer import LoraLinear, RowScales, fuse_linear, input_dims


@dataclass(frozen=True)
class AdapterSpec:
    """An adapter to load and the global scale it starts with.

    Raises:
        ValueError: `scale` is not finite.
    """

    path: str
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not math.isfinite(self.scale):
            raise ValueError(f"scale must be finite, got {self.scale}")


@dataclass(frozen=True)
class AdapterInfo:
    """A loaded adapter, as `GET /lora-adapters` lists it.

    Attributes:
        id: its index, in load order.
        path: the folder it was loaded from, as given.
        format: its layout.
        num_layers: linear layers it adapts.
    """

    id: int
    path: str
    format: AdapterFormat
    num_layers: int


class AdapterScaleError(ValueError):
    """Scales that cannot be set: fused adapters, or an id or value out of range."""


class LoraAdapters:
    """The adapters attached to one model, their global scales, and the scales of the rows
    of the next forward pass (mlxcel-core's `RowAdapterScales`).

    Args:
        infos: the adapters, by id.
        scales: their global scales.
        row_scales: the state the unfused layers read; None when the adapters are fused.
    """

    def __init__(
        self,
        infos: tuple[AdapterInfo, ...],
        scales: AdapterScales,
        row_scales: RowScales | None,
    ) -> None:
        self.infos = infos
        self._global = tuple(scales)
        self._row_scales = row_scales
        if row_scales is not None:
            row_scales.set([self._global])

    @property
    def fused(self) -> bool:
        """The updates are part of the weights: scales are fixed."""
        return self._row_scales is None

    @property
    def global_scales(self) -> AdapterScales:
        """The scales of requests that do not give their own."""
        return self._global

    def scales_from(self, entries: Mapping[int, float]) -> AdapterScales:
        """llama-server's `[{id, scale}]` semantics: listed adapters get their scale, the
        others 0.

        Raises:
            AdapterScaleError: the adapters are fused, an id is unknown or a scale is not
                finite.
        """
        if self.fused:
            raise AdapterScaleError(
                "the LoRA adapters are fused into the weights (--lora-fuse): their scales "
                "cannot change; restart without --lora-fuse to change them at run time"
            )
        for adapter_id, scale in entries.items():
            if not 0 <= adapter_id < len(self.infos):
                raise AdapterScaleError(
                    f"adapter id must be in [0, {len(self.infos) - 1}], got {adapter_id}"
                )
            if not math.isfinite(scale):
                raise AdapterScaleError(f"scale must be finite, got {scale}")
        return tuple(float(entries.get(i, 0.0)) for i in range(len(self.infos)))

    def set_global_scales(self, scales: AdapterScales) -> None:
        """Set the scales of requests arriving from now on (running ones keep theirs).

        Raises:
            AdapterScaleError: the adapters are fused or `scales` has the wrong length.
        """
        if len(scales) != len(self.infos):
            raise AdapterScaleError(
                f"scales must hold {len(self.infos)} values, one per adapter, got {len(scales)}"
            )
        self._global = self.scales_from(dict(enumerate(scales)))

    def resolve_scales(self, requested: AdapterScales | None) -> AdapterScales:
        """A request's own scales, or the global ones for None."""
        return self._global if requested is None else requested

    def set_row_scales(self, rows: Sequence[AdapterScales]) -> None:
        """Set each batch row's scales for the next forward pass (unfused adapters only).

        Raises:
            ValueError: the adapters are fused, or a row's length is not the adapter count.
        """
        if self._row_scales is None:
            raise ValueError("fused adapters have no per-row scales")
        self._row_scales.set(rows)


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
