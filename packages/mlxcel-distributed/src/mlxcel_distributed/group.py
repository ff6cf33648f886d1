"""Joining the `mx.distributed` group that the launcher (`mlx.launch` or mlxcel's own
local ranks) started this process in."""

from __future__ import annotations

import mlx.core as mx

from mlxcel_core.errors import MlxcelError


class GroupError(MlxcelError, RuntimeError):
    """The process could not join its group, or the group has the wrong size."""


def join_group(size: int, *, backend: str = "any") -> mx.distributed.Group:
    """Join the group MLX's environment describes (`MLX_RANK`, `MLX_HOSTFILE` for the ring
    backend; see `mx.distributed.init`) and check it has `size` ranks.

    Args:
        size: the ranks the group must have.
        backend: "ring", "mpi", "nccl", "jaccl", or "any" for the first that works.

    Raises:
        GroupError: no backend could start, or the group has another size.
    """
    try:
        group = mx.distributed.init(strict=True, backend=backend)
    except RuntimeError as error:
        raise GroupError(f"cannot join the distributed group ({backend}): {error}") from error
    if group.size() != size:
        raise GroupError(f"the group needs {size} ranks but the launch started {group.size()}")
    return group
