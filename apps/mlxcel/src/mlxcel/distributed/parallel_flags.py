"""`--tp N` and `--pp N`: run the model over N ranks, for `generate` and `serve`.

`--tp` splits every layer over the ranks (tensor parallelism), `--pp` gives each rank a
stage of consecutive layers (pipeline parallelism); they differ only in what each rank
keeps of the loaded model (`parallel_modes`). Every rank runs the same command line.
Rank 0 runs the command as usual, its engine sending each step to the others; ranks > 0
load the same model, keep their part, and run those steps (`mlxcel_distributed.lockstep`),
printing and serving nothing. Launched by `mlx.launch` (`MLX_RANK` set), a process joins
the launcher's group; otherwise it becomes rank 0 and starts ranks 1..N-1 on this machine
over loopback. llama-server has neither flag; the names are vLLM's
(`--tensor-parallel-size`, `--pipeline-parallel-size`) shortened.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

import mlx.core as mx

from mlxcel.common.flags import Flag, RunError, UsageError
from mlxcel.distributed.parallel_modes import (
    PIPELINE_PARALLEL,
    TENSOR_PARALLEL,
    ParallelMode,
    import_distributed,
)
from mlxcel.distributed.rank_group import form_group
from mlxcel_core.cache.paged import PagedKVStorage
from mlxcel_core.engine import EngineConfig, ModelRunner, RowAdapterScales, RunnerFactory
from mlxcel_core.language_model import LanguageModel
from mlxcel_models.default_model import default_model_path
from mlxcel_models.loaded import LoadedModel
from mlxcel_models.memory import read_model_inventory
from mlxcel_models.store import resolve_model

if TYPE_CHECKING:
    from mlxcel_distributed import Channel, LocalRanks, StageGuard, StageHealth

TP_FLAG = Flag(
    ("--tp", "--tensor-parallel-size"),
    "tp",
    int,
    1,
    "ranks to split the model over (tensor parallel); without mlx.launch, N-1 more "
    "processes start on this machine",
    env="MLXCEL_TP",
)
PP_FLAG = Flag(
    ("--pp", "--pipeline-parallel-size"),
    "pp",
    int,
    1,
    "ranks to split the model's layers over (pipeline parallel); without mlx.launch, N-1 "
    "more processes start on this machine",
    env="MLXCEL_PP",
)
PARALLEL_FLAGS = (TP_FLAG, PP_FLAG)
# Time for the other ranks to leave their step loop once told the engine has stopped.
FOLLOWER_STOP_SECONDS = 30.0


def parallel_mode_from(args: argparse.Namespace) -> tuple[ParallelMode, int] | None:
    """The way `--tp`/`--pp` split the model and the number of ranks; None for one process.

    Raises:
        UsageError: a size < 1, or both flags above 1.
    """
    for flag, size in (("--tp", args.tp), ("--pp", args.pp)):
        if size < 1:
            raise UsageError(f"{flag} must be >= 1, got {size}")
    if args.tp > 1 and args.pp > 1:
        raise UsageError("--tp and --pp cannot be combined: use one of them")
    if args.tp > 1:
        return TENSOR_PARALLEL, args.tp
    if args.pp > 1:
        return PIPELINE_PARALLEL, args.pp
    return None


def check_parallel(args: argparse.Namespace, engine_config: EngineConfig) -> None:
    """Refuse, before anything starts or loads, a `--tp`/`--pp` this model or these flags
    cannot use: the model (read from its headers) must allow the split (`ParallelMode`);
    speculative decoding and unfused LoRA adapters are not supported.

    Raises:
        UsageError: any of these, in one line.
        ModelLoadError: the model cannot be found or its headers read.
    """
    chosen = parallel_mode_from(args)
    if chosen is None:
        return
    mode, size = chosen
    if engine_config.speculative is not None:
        raise UsageError(
            f"{mode.flag} does not support speculative decoding (-md, --prompt-lookup-max)"
        )
    if (args.lora or args.lora_scaled) and not args.lora_fuse:
        raise UsageError(f"{mode.flag} needs LoRA adapters fused into the weights: add --lora-fuse")
    import_distributed(mode.flag)
    path = (
        default_model_path()
        if args.model is None
        else resolve_model(args.model, args.model_store, revision=args.revision)
    )
    mode.check_model(read_model_inventory(path), size)


class ParallelRank:
    """This process's place in a `--tp` or `--pp` group.

    Attributes:
        is_front: rank 0, which runs the engine; the others follow its steps.
        size: ranks in the group.
        stages_send: whether each rank sends its output on to the next (`--pp`).
        health: the group's faults, as rank 0 sees them.
    """

    def __init__(
        self,
        mode: ParallelMode,
        group: mx.distributed.Group,
        channel: Channel,
        local_ranks: LocalRanks | None,
        health: StageHealth,
    ) -> None:
        self._mode = mode
        self._group = group
        self._channel = channel
        self._local_ranks = local_ranks
        self._engine_started = False
        self.is_front = group.rank() == 0
        self.size = group.size()
        self.stages_send = mode.stages_send
        self.health = health

    def prepare(self, loaded: LoadedModel) -> LoadedModel:
        """Keep this rank's part of the model (its shard or its stage); the model to run.

        Raises:
            UsageError: the model's class cannot be split this way.
        """
        return self._mode.prepare(loaded, self._group)

    def make_runner(self, guard: StageGuard | None = None) -> RunnerFactory:
        """Rank 0's runner factory for the engine: it sends every step to the other ranks,
        under `guard` (the stage timeout, health and metrics) when one is given."""
        distributed = import_distributed(self._mode.flag)
        factory = distributed.make_lockstep_runner_factory(self._channel, guard)

        def make_runner(
            model: LanguageModel, storage: PagedKVStorage, adapters: RowAdapterScales | None
        ) -> ModelRunner:
            runner = factory(model, storage, adapters)
            self._engine_started = True
            return runner

        return make_runner

    def follow(self, loaded: LoadedModel, engine_config: EngineConfig) -> int:
        """Run rank 0's engine steps on this rank until it stops; the exit code (0).

        Raises:
            RunError: a message from rank 0 came out of order, or another rank is gone.
        """
        distributed = import_distributed(self._mode.flag)
        try:
            distributed.follow_steps(loaded.model, engine_config, self._channel)
        except distributed.LockstepError as error:
            raise RunError(f"rank {self._group.rank()}: {error}") from error
        # MLX's error when another rank of the group is gone (see `stage_guard`), or what a
        # collective it failed midway left in the step frame.
        except (RuntimeError, ValueError) as error:
            raise RunError(f"rank {self._group.rank()} lost the group: {error}") from error
        return 0

    def close(self) -> None:
        """On rank 0: end the other ranks' step loops (or, when the engine never started,
        stop the local ranks at once) and wait for the local ranks to exit."""
        if not self.is_front:
            return
        if self._local_ranks is not None:
            self._local_ranks.stop_watching()
        # A group with a rank at fault can run no collective, the shutdown message included.
        in_step = self._engine_started and self.health.fault is None
        if in_step:
            self._channel.send(import_distributed(self._mode.flag).Shutdown())
        if self._local_ranks is not None:
            timeout = FOLLOWER_STOP_SECONDS if in_step else 0.0
            self._local_ranks.stop(timeout)


@contextmanager
def parallel_rank(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    err: TextIO,
    *,
    keep_front_up: bool = False,
) -> Iterator[ParallelRank | None]:
    """Join the group of `--tp N` or `--pp N` ranks (None for one process), starting ranks
    1..N-1 on this machine unless a launcher started this process; on leaving, rank 0
    stops them.

    A local rank that exits early ends rank 0 with one line, unless `keep_front_up`: then
    it is reported to the rank's `health` instead (the server decides).

    Raises:
        UsageError: the flags are invalid (see `parallel_mode_from`).
        RunError: the group cannot be formed, or a local rank cannot be started.
    """
    chosen = parallel_mode_from(args)
    if chosen is None:
        yield None
        return
    mode, size = chosen
    distributed = import_distributed(mode.flag)
    health = distributed.StageHealth()

    def report_exit(rank: int, code: int) -> None:
        if keep_front_up:
            health.report(distributed.StageFault(rank, f"exited with code {code}"))
            return
        print(f"mlxcel: error: rank {rank} exited with code {code}", file=err, flush=True)
        os._exit(1)

    group, local_ranks = form_group(
        distributed, args.argv, size, f"{mode.flag} {size}", environ, report_exit
    )
    rank = ParallelRank(mode, group, mode.channel(distributed, group), local_ranks, health)
    try:
        yield rank
    finally:
        rank.close()
