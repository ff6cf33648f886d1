"""Forming the group of processes one command runs as (`--tp`, `--pp`, `--disaggregate`).

Launched by `mlx.launch` (`MLX_RANK` or `MLX_HOSTFILE` set), a process joins the launcher's
group; otherwise it becomes rank 0 and starts the other ranks on this machine over loopback,
each running the same command line, with the machine's cores shared among them
(`blas_threads`) and its CUDA GPUs too: with a GPU for every rank they form an NCCL group,
one GPU each, otherwise a ring group.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING

import mlx.core as mx

from mlxcel.common.blas_threads import limit_own_blas_threads, rank_blas_environment
from mlxcel.common.flags import RunError

if TYPE_CHECKING:
    from mlxcel_distributed import LocalRanks

_LAUNCHER_VARIABLES = ("MLX_RANK", "MLX_HOSTFILE")
_NCCL_VARIABLES = ("NCCL_HOST_IP", "NCCL_PORT", "MLX_WORLD_SIZE")


def launched_backend(environ: Mapping[str, str]) -> str:
    """The backend whose variables `environ` holds: "ring" for a host file, "nccl" for
    NCCL's rendezvous address and the group's size (all that `mlx.launch --backend nccl`
    sets), else "any" (MPI's launchers set only their own variables)."""
    if "MLX_HOSTFILE" in environ:
        return "ring"
    if all(name in environ for name in _NCCL_VARIABLES):
        return "nccl"
    return "any"


def form_group(
    distributed: ModuleType,
    argv: tuple[str, ...],
    size: int,
    flag: str,
    environ: Mapping[str, str],
    on_exit: Callable[[int, int], None],
) -> tuple[mx.distributed.Group, LocalRanks | None]:
    """Join or start the group of `size` ranks that `flag` asks for.

    Args:
        distributed: the `mlxcel_distributed` package.
        argv: the command line the other local ranks run (without the program name).
        size: the ranks in the group.
        flag: the flag that asked for the group, for messages.
        environ: this process's environment.
        on_exit: called with (rank, exit code) when a local rank exits early.

    Returns:
        The group, and the local ranks this process started (None under a launcher).

    Raises:
        RunError: the local ranks cannot be started, or the group cannot be joined.
    """
    local_ranks = None
    if not any(name in environ for name in _LAUNCHER_VARIABLES):
        blas = rank_blas_environment(environ, size)
        if blas:
            limit_own_blas_threads(int(blas["OPENBLAS_NUM_THREADS"]))
        try:
            devices = distributed.visible_cuda_devices(environ)
            backend = distributed.local_backend(size, devices)
            if backend == "nccl":
                # The other ranks wait only about 15 s for rank 0 to hand out NCCL's id once
                # they join; starting CUDA here, while they start, keeps that out of the wait.
                mx.eval(mx.zeros(1))
            local_ranks = distributed.LocalRanks(
                [sys.executable, "-m", "mlxcel", *argv],
                size,
                # The other ranks' loading bars would interleave with rank 0's.
                environ={**environ, **blas, "TQDM_DISABLE": "1"},
                on_exit=on_exit,
                backend=backend,
                devices=devices,
            )
        except OSError as error:
            raise RunError(f"cannot start the other {flag} ranks: {error}") from error
        if not local_ranks.wait_until_ready():
            raise RunError(f"the other {flag} ranks exited while starting")
        os.environ.update(local_ranks.environment)
    elif distributed.READY_FD_VARIABLE in environ:
        distributed.signal_ready(int(environ[distributed.READY_FD_VARIABLE]))
    try:
        group = distributed.join_group(size, backend=launched_backend(os.environ))
    except distributed.GroupError as error:
        if local_ranks is not None:
            local_ranks.stop(0.0)
        raise RunError(f"{flag}: {error}") from error
    return group, local_ranks
