"""`--tp N`: split the model over N ranks (tensor parallelism), for `generate` and `serve`.

Every rank runs the same command line. Rank 0 runs the command as usual, its engine
sending each step to the others; ranks > 0 load and shard the same model and run those
steps (`mlxcel_distributed.lockstep`), printing and serving nothing. Launched by
`mlx.launch` (`MLX_RANK` set), a process joins the launcher's group; otherwise it becomes
rank 0 and starts ranks 1..N-1 on this machine over loopback. llama-server has no such
flag; the name is vLLM's (`--tensor-parallel-size`) shortened.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

import mlx.core as mx

from mlxcel.flags import Flag, RunError, UsageError
from mlxcel_core.cache.paged import PagedKVStorage
from mlxcel_core.engine import EngineConfig, ModelRunner, RowAdapterScales, RunnerFactory
from mlxcel_core.generate import LanguageModel
from mlxcel_models.default_model import default_model_path
from mlxcel_models.loaded import LoadedModel
from mlxcel_models.memory import read_model_inventory
from mlxcel_models.store import resolve_model

if TYPE_CHECKING:
    from mlxcel_distributed import LocalRanks, StepChannel

TP_FLAG = Flag(
    ("--tp", "--tensor-parallel-size"),
    "tp",
    int,
    1,
    "ranks to split the model over (tensor parallel); without mlx.launch, N-1 more "
    "processes start on this machine",
    env="MLXCEL_TP",
)
# Time for the other ranks to leave their step loop once told the engine has stopped.
FOLLOWER_STOP_SECONDS = 30.0
_LAUNCHER_VARIABLES = ("MLX_RANK", "MLX_HOSTFILE")


def _import_distributed():
    try:
        import mlxcel_distributed
    except ImportError as error:
        raise UsageError(
            "--tp needs the distributed extra: pip install 'mlxcel[distributed]'"
        ) from error
    return mlxcel_distributed


def check_tensor_parallel(args: argparse.Namespace, engine_config: EngineConfig) -> None:
    """Refuse, before anything starts or loads, a `--tp` this model or these flags cannot
    use: the model's heads and MLP width must divide by N (read from its headers);
    speculative decoding and unfused LoRA adapters are not supported.

    Raises:
        UsageError: any of these, in one line.
        ModelLoadError: the model cannot be found or its headers read.
    """
    if args.tp < 1:
        raise UsageError(f"--tp must be >= 1, got {args.tp}")
    if args.tp == 1:
        return
    if engine_config.speculative is not None:
        raise UsageError("--tp does not support speculative decoding (-md, --prompt-lookup-max)")
    if (args.lora or args.lora_scaled) and not args.lora_fuse:
        raise UsageError("--tp needs LoRA adapters fused into the weights: add --lora-fuse")
    distributed = _import_distributed()
    path = (
        default_model_path()
        if args.model is None
        else resolve_model(args.model, args.model_store, revision=args.revision)
    )
    try:
        distributed.check_tp_size(read_model_inventory(path).architecture, args.tp)
    except distributed.TensorParallelError as error:
        raise UsageError(str(error)) from error


class TensorParallelRank:
    """This process's place in a tensor-parallel group.

    Attributes:
        is_front: rank 0, which runs the engine; the others follow its steps.
    """

    def __init__(
        self, group: mx.distributed.Group, channel: StepChannel, local_ranks: LocalRanks | None
    ) -> None:
        self._group = group
        self._channel = channel
        self._local_ranks = local_ranks
        self._engine_started = False
        self.is_front = group.rank() == 0

    def shard(self, loaded: LoadedModel) -> None:
        """Keep this rank's shard of the model.

        Raises:
            UsageError: the model's class cannot be sharded.
        """
        distributed = _import_distributed()
        try:
            distributed.shard_model(loaded.model, self._group)
        except distributed.TensorParallelError as error:
            raise UsageError(str(error)) from error

    def make_runner(self) -> RunnerFactory:
        """Rank 0's runner factory for the engine: it sends every step to the other ranks."""
        factory = _import_distributed().make_lockstep_runner_factory(self._channel)

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
            RunError: a message from rank 0 came out of order.
        """
        distributed = _import_distributed()
        try:
            distributed.follow_steps(loaded.model, engine_config, self._channel)
        except distributed.LockstepError as error:
            raise RunError(f"rank {self._group.rank()}: {error}") from error
        return 0

    def close(self) -> None:
        """On rank 0: end the other ranks' step loops (or, when the engine never started,
        stop the local ranks at once) and wait for the local ranks to exit."""
        if not self.is_front:
            return
        if self._local_ranks is not None:
            self._local_ranks.stop_watching()
        if self._engine_started:
            self._channel.send(_import_distributed().Shutdown())
        if self._local_ranks is not None:
            timeout = FOLLOWER_STOP_SECONDS if self._engine_started else 0.0
            self._local_ranks.stop(timeout)


@contextmanager
def tensor_parallel_rank(
    args: argparse.Namespace, environ: Mapping[str, str], err: TextIO
) -> Iterator[TensorParallelRank | None]:
    """Join the group of `--tp N` ranks (None for `--tp 1`), starting ranks 1..N-1 on
    this machine unless a launcher started this process; on leaving, rank 0 stops them.

    Raises:
        RunError: the group cannot be formed, or a local rank cannot be started.
    """
    if args.tp == 1:
        yield None
        return
    distributed = _import_distributed()
    local_ranks = None
    if not any(name in environ for name in _LAUNCHER_VARIABLES):

        def report_exit(rank: int, code: int) -> None:
            print(f"mlxcel: error: rank {rank} exited with code {code}", file=err, flush=True)
            os._exit(1)

        try:
            local_ranks = distributed.LocalRanks(
                [sys.executable, "-m", "mlxcel", *args.argv],
                args.tp,
                # The other ranks' loading bars would interleave with rank 0's.
                environ={**environ, "TQDM_DISABLE": "1"},
                on_exit=report_exit,
            )
        except OSError as error:
            raise RunError(f"cannot start the other --tp ranks: {error}") from error
        if not local_ranks.wait_until_ready():
            raise RunError("the other --tp ranks exited while starting")
        os.environ.update(local_ranks.environment)
    elif distributed.READY_FD_VARIABLE in environ:
        distributed.signal_ready(int(environ[distributed.READY_FD_VARIABLE]))
    backend = "ring" if "MLX_HOSTFILE" in os.environ else "any"
    try:
        group = distributed.join_group(args.tp, backend=backend)
    except distributed.GroupError as error:
        if local_ranks is not None:
            local_ranks.stop(0.0)
        raise RunError(str(error)) from error
    rank = TensorParallelRank(group, distributed.StepChannel(group), local_ranks)
    try:
        yield rank
    finally:
        rank.close()
