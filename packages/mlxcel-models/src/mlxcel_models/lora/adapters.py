"""LoRA adapters attached to a model (see `mlxcel_models.attach_lora`) and their scales at
run time: global ones, and one set per row of the batch for unfused adapters."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mlxcel_core.adapters import AdapterScales
from mlxcel_core.errors import InputError
from mlxcel_models.lora.formats import AdapterFormat
from mlxcel_models.lora.layer import RowScales


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


class AdapterScaleError(InputError, ValueError):
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
