"""How `--tp` and `--pp` split a model over a group of ranks: what each refuses from the
model's headers before any rank starts, and what each rank keeps of the loaded model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

import mlx.core as mx

from mlxcel.common.flags import UsageError, import_extra
from mlxcel_models.loaded import LoadedModel
from mlxcel_models.memory import ModelInventory


def import_distributed(flag: str) -> ModuleType:
    """The `mlxcel_distributed` package.

    Raises:
        UsageError: the distributed extra is not installed; the message names `flag`.
    """
    return import_extra("mlxcel_distributed", extra="distributed", needed_by=flag)


@dataclass(frozen=True)
class ParallelMode:
    """One way of splitting the model over ranks.

    Attributes:
        flag: the flag that asks for it (`--tp`, `--pp`), for messages.
        check_model: `check_model(inventory, size)` raises `UsageError` (one line) when the
            model, read from its headers, cannot be split over `size` ranks this way.
        prepare: `prepare(loaded, group)` keeps this rank's part of the loaded model and
            returns the model this rank runs; raises `UsageError` when it cannot.
        channel: `channel(distributed, group)`, how rank 0's step messages reach the
            others (`distributed` is the `mlxcel_distributed` package).
        stages_send: whether each rank sends its output on to the next (a pipeline).
    """

    flag: str
    check_model: Callable[[ModelInventory, int], None]
    prepare: Callable[[LoadedModel, mx.distributed.Group], LoadedModel]
    channel: Callable[[ModuleType, mx.distributed.Group], Any]
    stages_send: bool


def _check_heads(inventory: ModelInventory, size: int) -> None:
    family = inventory.family
    if not family.supports_tensor_parallel:
        raise UsageError(
            f"--tp: the {family.model_type} family does not support tensor parallelism"
        )
    distributed = import_distributed("--tp")
    try:
        distributed.check_tp_size(inventory.architecture, size)
    except distributed.TensorParallelError as error:
        raise UsageError(str(error)) from error


def _shard(loaded: LoadedModel, group: mx.distributed.Group) -> LoadedModel:
    distributed = import_distributed("--tp")
    try:
        distributed.shard_model(loaded.model, group)
    except distributed.TensorParallelError as error:
        raise UsageError(str(error)) from error
    return loaded


def _check_stages(inventory: ModelInventory, size: int) -> None:
    family = inventory.family
    if not family.supports_pipeline_parallel:
        raise UsageError(f"--pp: the {family.model_type} family does not support pipeline stages")
    num_layers = inventory.architecture.num_layers
    if size > num_layers:
        raise UsageError(
            f"--pp {size}: the model has {num_layers} layers, so at most {num_layers} stages"
        )


def _make_stage(loaded: LoadedModel, group: mx.distributed.Group) -> LoadedModel:
    distributed = import_distributed("--pp")
    try:
        stage = distributed.make_pipeline_stage(loaded.model, group)
    except ValueError as error:
        raise UsageError(f"--pp: {error}") from error
    # The engine and the runners only call the model; the stage stands in for it.
    return replace(loaded, model=stage)


def _all_sum_channel(distributed: ModuleType, group: mx.distributed.Group) -> Any:
    return distributed.StepChannel(group)


def _pipeline_channel(distributed: ModuleType, group: mx.distributed.Group) -> Any:
    return distributed.PipelineChannel(group)


TENSOR_PARALLEL = ParallelMode("--tp", _check_heads, _shard, _all_sum_channel, False)
"""Every rank keeps a shard of every layer (`mlxcel_distributed.tensor_parallel`); each
step's message reaches them all in one all-sum."""

PIPELINE_PARALLEL = ParallelMode("--pp", _check_stages, _make_stage, _pipeline_channel, True)
"""Every rank keeps a stage of consecutive layers (`mlxcel_distributed.pipeline_stage`);
step messages pass down the pipeline, so its stages can work on different steps."""
