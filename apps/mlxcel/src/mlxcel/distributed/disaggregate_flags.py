"""`--disaggregate`: prefill prompts on a second rank, decode on the first (`mlxcel serve`).

Both ranks run the same command line (`rank_group`). Rank 0 runs the server and the engine,
which decodes; each new prompt goes to rank 1, which computes its KV blocks and sends their
contents back over `mx.distributed` while rank 0 keeps decoding
(`mlxcel_distributed.disaggregate_front`, `disaggregate_prefill`). Rank 1's faults (an exit,
a failed link, a prompt past its deadline) go to the pair's `health`; the server decides
what they do (`stage_faults`). llama-server has no such flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

import mlx.core as mx

from mlxcel.common.flags import Flag, RunError, UsageError
from mlxcel.distributed.parallel_modes import import_distributed
from mlxcel.distributed.rank_group import form_group
from mlxcel_core.engine import EngineConfig, PrefillJob, RemotePrefill, RemotePrefillFactory
from mlxcel_models.loaded import LoadedModel

if TYPE_CHECKING:
    from mlxcel_distributed import LocalRanks, PrefillDeadline, PrefillMetrics, StageHealth

DISAGGREGATE_FLAG = Flag(
    ("--disaggregate",),
    "disaggregate",
    bool,
    False,
    "prefill prompts on a second rank and decode on this one; without mlx.launch, the "
    "second rank starts on this machine",
    env="MLXCEL_DISAGGREGATE",
    is_switch=True,
)
NUM_RANKS = 2
# Time for the prefill rank to leave its loop once told the engine has stopped.
PREFILL_STOP_SECONDS = 30.0
# Cache types whose pools share one dtype, the form blocks travel in.
_TRANSFERABLE_CACHE_TYPES = ("auto", "f32", "f16", "bf16")


def check_disaggregate(args: argparse.Namespace, engine_config: EngineConfig) -> None:
    """Refuse, before anything starts, what `--disaggregate` does not support: tensor and
    pipeline parallelism, speculative decoding, unfused LoRA adapters, and KV cache types whose
    pools differ in dtype (quantized types, or different key and value types).

    Raises:
        UsageError: any of these, in one line.
    """
    if not args.disaggregate:
        return
    if args.tp > 1 or args.pp > 1:
        raise UsageError("--disaggregate does not support --tp or --pp")
    if engine_config.speculative is not None:
        raise UsageError(
            "--disaggregate does not support speculative decoding (-md, --prompt-lookup-max)"
        )
    if (args.lora or args.lora_scaled) and not args.lora_fuse:
        raise UsageError(
            "--disaggregate needs LoRA adapters fused into the weights: add --lora-fuse"
        )
    kinds = {engine_config.cache_type_k, engine_config.cache_type_v}
    if len(kinds) != 1 or not kinds <= set(_TRANSFERABLE_CACHE_TYPES):
        raise UsageError(
            "--disaggregate needs -ctk and -ctv to be the same one of "
            f"{', '.join(_TRANSFERABLE_CACHE_TYPES)}; got {engine_config.cache_type_k} "
            f"and {engine_config.cache_type_v}"
        )
    import_distributed("--disaggregate")


class DisaggregatedRank:
    """This process's place in a disaggregated pair.

    Attributes:
        is_front: rank 0, which runs the server and the decoding engine; rank 1 prefills.
        health: rank 1's fault, as rank 0 sees it.
    """

    def __init__(
        self, group: mx.distributed.Group, local_ranks: LocalRanks | None, health: StageHealth
    ) -> None:
        self._group = group
        self._local_ranks = local_ranks
        self._engine_started = False
        self.is_front = group.rank() == 0
        self.health = health

    def make_remote_prefill(
        self,
        on_failure: Callable[[BaseException], None],
        metrics: PrefillMetrics,
        deadline: PrefillDeadline,
    ) -> RemotePrefillFactory:
        """Rank 0's engine factory for where prompts are prefilled: rank 1, each job held
        to `deadline` and measured into `metrics`; a failed link is reported to
        `on_failure` (on the link's thread)."""
        distributed = import_distributed("--disaggregate")
        factory = distributed.make_prefill_client_factory(
            self._group, on_failure, metrics, deadline
        )

        def make_remote_prefill(storage, deliver) -> RemotePrefill:
            remote = factory(storage, deliver)
            self._engine_started = True
            return _ExitExpectedOnClose(remote, self._local_ranks)

        return make_remote_prefill

    def serve_prefills(self, loaded: LoadedModel, engine_config: EngineConfig, context: int) -> int:
        """Rank 1: prefill every prompt rank 0 sends until it stops; the exit code (0).

        Args:
            loaded: the model, as rank 0 loaded it.
            engine_config: rank 0's engine settings.
            context: the context size rank 0's engine runs with (tokens).

        Raises:
            RunError: a message from rank 0 is malformed, or rank 0 is gone.
        """
        config = replace(engine_config, context_size=context)
        try:
            import_distributed("--disaggregate").serve_prefills(loaded.model, config, self._group)
        except ValueError as error:
            raise RunError(f"rank 1: {error}") from error
        # MLX's error when the link's peer is gone (see `mlxcel_distributed.stage_guard`).
        except RuntimeError as error:
            raise RunError(f"rank 1 lost the group: {error}") from error
        return 0

    def close(self) -> None:
        """On rank 0: wait for the local prefill rank to exit (its engine's shutdown told it
        to), or stop it at once when the engine never started or rank 1 is at fault (no
        shutdown reached it)."""
        if not self.is_front or self._local_ranks is None:
            return
        self._local_ranks.stop_watching()
        told_to_stop = self._engine_started and self.health.fault is None
        self._local_ranks.stop(PREFILL_STOP_SECONDS if told_to_stop else 0.0)


class _ExitExpectedOnClose(RemotePrefill):
    """The engine's remote prefill, after whose closing (which sends rank 1 its shutdown)
    a local rank 1's exit is expected, not a fault."""

    def __init__(self, remote: RemotePrefill, local_ranks: LocalRanks | None) -> None:
        self._remote = remote
        self._local_ranks = local_ranks

    def submit(self, job: PrefillJob) -> None:
        self._remote.submit(job)

    def close(self) -> None:
        if self._local_ranks is not None:
            self._local_ranks.stop_watching()
        self._remote.close()


@contextmanager
def disaggregated_rank(
    args: argparse.Namespace, environ: Mapping[str, str]
) -> Iterator[DisaggregatedRank | None]:
    """Join the pair of `--disaggregate` ranks (None without the flag), starting rank 1 on
    this machine unless a launcher started this process; on leaving, rank 0 stops it.
    A local rank 1 that exits early is reported to the pair's `health`.

    Raises:
        RunError: the group cannot be formed, or the prefill rank cannot be started.
    """
    if not args.disaggregate:
        yield None
        return
    distributed = import_distributed("--disaggregate")
    health = distributed.StageHealth()

    def report_exit(rank: int, code: int) -> None:
        health.report(distributed.StageFault(rank, f"exited with code {code}"))

    group, local_ranks = form_group(
        distributed, args.argv, NUM_RANKS, "--disaggregate", environ, report_exit
    )
    rank = DisaggregatedRank(group, local_ranks, health)
    try:
        yield rank
    finally:
        rank.close()
