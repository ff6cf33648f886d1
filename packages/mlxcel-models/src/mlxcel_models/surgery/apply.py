"""Applying a surgery plan to a loaded, not yet evaluated, mlx-lm model.

Every edit is checked against the model (and the checkpoints it reads) before any tensor
changes; then the edits run in file order, each on the result of the ones before. Nothing
is evaluated here: the loader evaluates the edited weights as it would the file's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from mlxcel_models.errors import ModelLoadError
from mlxcel_models.surgery.errors import SurgeryError
from mlxcel_models.surgery.plan import (
    AddEdit,
    Edit,
    InterpolateEdit,
    PruneEdit,
    PruneTarget,
    ReplaceEdit,
    ScaleEdit,
    SurgeryPlan,
    Where,
)
from mlxcel_models.surgery.prune import prune_masks
from mlxcel_models.surgery.select import select_tensors
from mlxcel_models.surgery.tensors import ModelTensors

logger = logging.getLogger(__name__)

CheckpointReader = Callable[[Path], nn.Module]
"""Builds another checkpoint's model as the target was built (same loader and compute
options), weights unevaluated; raises `ModelLoadError`."""

Transform = Callable[[mx.array], mx.array]
"""A float32 tensor's new value from its current one."""


@dataclass(frozen=True)
class EffectiveEdit:
    """One applied edit, as logged: where the file asks for it, what it does, and how many
    tensors it changed."""

    where: Where
    op: str
    detail: str
    num_tensors: int

    def __str__(self) -> str:
        return f"{self.where}: {self.op} {self.detail}: {self.num_tensors} tensors"


def apply_surgery(
    module: nn.Module, plan: SurgeryPlan, *, read_checkpoint: CheckpointReader
) -> tuple[EffectiveEdit, ...]:
    """Edit `module`'s parameters in place as `plan` says; log each edit at INFO.

    Args:
        module: an mlx-lm model whose `model.layers` are the decoder layers; float or
            affine-quantized weights (quantized ones are requantized, see `tensors`).
        plan: the edits, from `read_surgery_file`.
        read_checkpoint: loads the checkpoints named by `from`.

    Returns:
        The edits applied, in order.

    Raises:
        SurgeryError: a pattern matches no tensor, an index or range is outside the model,
            another checkpoint cannot be loaded, lacks a tensor or has it in another shape;
            the message starts with the surgery file's `FILE:LINE`.
    """
    tensors = ModelTensors(module)
    num_layers = len(module.model.layers)
    selected = [_select(edit, tensors, module, num_layers) for edit in plan.edits]
    sources = _read_sources(plan, read_checkpoint)
    transforms = [
        _transforms(edit, targets, tensors, sources)
        for edit, targets in zip(plan.edits, selected, strict=True)
    ]
    applied = []
    for edit, changes in zip(plan.edits, transforms, strict=True):
        for name, transform in changes.items():
            tensors.update(name, transform)
        effective = EffectiveEdit(edit.where, _op_name(edit), _detail(edit), len(changes))
        logger.info("surgery %s", effective)
        applied.append(effective)
    return tuple(applied)


Selected = list[str] | dict[str, mx.array]
"""The tensors an edit changes: their names, or for prune each one's zeroing mask."""


def _select(edit: Edit, tensors: ModelTensors, module: nn.Module, num_layers: int) -> Selected:
    if isinstance(edit, PruneEdit):
        return prune_masks(edit, tensors, module, num_layers)
    return select_tensors(edit.selection, tensors.names, num_layers)


def _read_sources(plan: SurgeryPlan, read_checkpoint: CheckpointReader) -> dict[Path, ModelTensors]:
    sources = {}
    for path, first_use in plan.sources.items():
        try:
            sources[path] = ModelTensors(read_checkpoint(path))
        except ModelLoadError as error:
            raise SurgeryError(f"{first_use}: cannot load checkpoint {path}: {error}") from error
    return sources


def _transforms(
    edit: Edit, targets: Selected, tensors: ModelTensors, sources: Mapping[Path, ModelTensors]
) -> dict[str, Transform]:
    if isinstance(edit, PruneEdit):
        return {name: _multiply(mask) for name, mask in targets.items()}
    if isinstance(edit, ScaleEdit):
        return {name: _multiply(edit.factor) for name in targets}
    if isinstance(edit, AddEdit) and edit.value is not None:
        return {name: _add_constant(edit.value) for name in targets}
    source = sources[edit.source]
    if isinstance(edit, AddEdit) and edit.source_tensor is not None:
        other = _source_tensor(edit, edit.source_tensor, source)
        for name in targets:
            _check_shape(edit, name, tensors.shape(name), edit.source_tensor, other.shape)
        return {name: _add_array(other) for name in targets}
    changes = {}
    for name in targets:
        other = _source_tensor(edit, name, source)
        _check_shape(edit, name, tensors.shape(name), name, other.shape)
        if isinstance(edit, AddEdit):
            changes[name] = _add_array(other)
        elif isinstance(edit, ReplaceEdit):
            changes[name] = _constant(other)
        else:
            changes[name] = _blend(other, edit.alpha)
    return changes


def _source_tensor(edit: Edit, name: str, source: ModelTensors) -> mx.array:
    if name not in source:
        raise SurgeryError(f"{edit.where}: checkpoint {edit.source} has no tensor {name}")
    return source.read(name)


def _check_shape(
    edit: Edit, name: str, shape: tuple[int, ...], source_name: str, source_shape: tuple
) -> None:
    if tuple(source_shape) != shape:
        theirs = "" if source_name == name else f" ({source_name})"
        raise SurgeryError(
            f"{edit.where}: {name} has shape {shape} in the model but "
            f"{tuple(source_shape)} in {edit.source}{theirs}"
        )


def _multiply(factor: float | mx.array) -> Transform:
    return lambda value: value * factor


def _add_constant(constant: float) -> Transform:
    return lambda value: value + constant


def _add_array(other: mx.array) -> Transform:
    return lambda value: value + other


def _constant(other: mx.array) -> Transform:
    return lambda _: other


def _blend(other: mx.array, alpha: float) -> Transform:
    return lambda value: (1.0 - alpha) * value + alpha * other


def _op_name(edit: Edit) -> str:
    return {
        ScaleEdit: "scale",
        AddEdit: "add",
        PruneEdit: "prune",
        ReplaceEdit: "replace",
        InterpolateEdit: "interpolate",
    }[type(edit)]


def _detail(edit: Edit) -> str:
    layers = ", ".join(map(str, edit.selection.layers))
    scope = f" in layers {layers}" if layers else ""
    if isinstance(edit, ScaleEdit):
        return f"x{edit.factor:g}{scope}"
    if isinstance(edit, AddEdit):
        if edit.value is not None:
            return f"{edit.value:+g}{scope}"
        tensor = f" tensor {edit.source_tensor}" if edit.source_tensor else ""
        return f"{edit.source}{tensor}{scope}"
    if isinstance(edit, PruneEdit):
        if edit.target is PruneTarget.LAYERS:
            return f"layers {layers}"
        return f"{edit.target.value} {', '.join(map(str, edit.indices))}{scope}"
    if isinstance(edit, ReplaceEdit):
        return f"from {edit.source}{scope}"
    return f"alpha {edit.alpha:g} with {edit.source}{scope}"
