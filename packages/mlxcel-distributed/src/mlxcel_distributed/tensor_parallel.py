"""Tensor parallelism: which group sizes a model allows, and sharding it over a group.

The model's own `shard(group)` (mlx-lm's model classes, e.g. `mlx_lm/models/llama.py`)
splits each attention layer by heads and each MLP by columns then rows, with MLX's sharded
linear layers (`mlx.nn.layers.distributed.shard_linear`): every layer ends in one all-sum,
so each rank holds 1/N of the layer weights and of the KV heads, and all ranks compute the
same hidden states and logits (embeddings and the LM head are not split).
"""

from __future__ import annotations

import math
from typing import Protocol, runtime_checkable

import mlx.core as mx

from mlxcel_core.errors import InputError
from mlxcel_models.language_model import MlxLmLanguageModel
from mlxcel_models.memory import Architecture


class TensorParallelError(InputError, ValueError):
    """The model cannot be split over the group asked for."""


@runtime_checkable
class ShardableModule(Protocol):
    """A model class that splits itself over a distributed group."""

    def shard(self, group: mx.distributed.Group) -> None: ...


def valid_tp_sizes(architecture: Architecture) -> list[int]:
    """Group sizes that divide the query heads, the key/value heads and the MLP width."""
    common = math.gcd(
        architecture.num_heads, architecture.num_kv_heads, architecture.intermediate_size
    )
    return [size for size in range(1, common + 1) if common % size == 0]


def check_tp_size(architecture: Architecture, size: int) -> None:
    """Check that `size` ranks can share the model's heads and MLP width evenly.

    Raises:
        TensorParallelError: `size` < 1, or one of those counts does not divide by it; the
            message gives the counts and the valid sizes.
    """
    if size < 1:
        raise TensorParallelError(f"--tp must be >= 1, got {size}")
    counts = {
        "query heads": architecture.num_heads,
        "key/value heads": architecture.num_kv_heads,
        "MLP width": architecture.intermediate_size,
    }
    uneven = [f"{count} {name}" for name, count in counts.items() if count % size]
    if uneven:
        listed = " and ".join([", ".join(uneven[:-1]), uneven[-1]] if len(uneven) > 1 else uneven)
        valid = ", ".join(map(str, valid_tp_sizes(architecture)))
        raise TensorParallelError(
            f"--tp {size}: the model's {listed} do not divide by {size}; valid sizes: {valid}"
        )


def shard_model(model: MlxLmLanguageModel, group: mx.distributed.Group) -> None:
    """Split `model` over `group` in place (this rank keeps its shard) and evaluate it.

    Raises:
        TensorParallelError: the model's class cannot shard itself.
    """
    module = model.module
    if not isinstance(module, ShardableModule):
        raise TensorParallelError(
            f"the {type(module).__module__} model class does not support tensor parallelism"
        )
    module.shard(group)
    mx.eval(module.parameters())
