"""`--stage-timeout`: how `mlxcel serve --tp N`, `--pp N` or `--disaggregate` stays up when
a rank dies or hangs.

Rank 0 watches its ranks two ways: the exit of a rank it started itself (seen at once), and
a deadline on every engine step, or under `--disaggregate` on every prefill job (a hung
rank, and at times a dead one, blocks rank 0's collectives, or its wait for a prompt's KV,
for good). Either makes the server degraded: requests in flight end with an error, new
ones get 503, and `/health` answers 503 with the rank and the reason. A rank that fails
while the model loads still ends the command with one line.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, TextIO

from mlxcel.common.flags import Flag, UsageError
from mlxcel.distributed.disaggregate_flags import DisaggregatedRank
from mlxcel.distributed.parallel_flags import ParallelRank
from mlxcel_core.engine import RemotePrefillFactory
from mlxcel_server import ServerState
from mlxcel_server.stage_metrics import PrefillCollector, StageCollector
from mlxcel_server.state import Degradation

if TYPE_CHECKING:
    from mlxcel_distributed import StageFault, StageGuard, StageHealth

STAGE_TIMEOUT_FLAG = Flag(
    ("--stage-timeout",),
    "stage_timeout",
    float,
    30.0,
    "with --tp or --pp: seconds an engine step may take, with --disaggregate: seconds the "
    "prefill rank may take per -ub chunk of a prompt, before the rank counts as hung and the "
    "server answers 503",
    env="MLXCEL_STAGE_TIMEOUT",
)


def check_stage_timeout(args: argparse.Namespace) -> None:
    """Raises `UsageError` when `--stage-timeout` is not a positive number of seconds."""
    if not args.stage_timeout > 0:
        raise UsageError(f"--stage-timeout must be > 0 seconds, got {args.stage_timeout}")


def guard_stages(
    rank: ParallelRank, state: ServerState, timeout: float, err: TextIO, *, reports: bool
) -> StageGuard:
    """The stage guard of rank 0's engine: a step past `timeout` seconds counts as a hung
    rank; a fault degrades `state` once it serves (ending the requests in flight, though
    the engine thread may stay blocked), and `/metrics` shows the group, with the other
    ranks' own step times when `reports` (the metrics are served).
    """
    import mlxcel_distributed as distributed

    health = rank.health
    metrics = distributed.StageMetrics(rank.size, stages_send=rank.stages_send)

    def on_overrun(seconds: float) -> None:
        reason = f"an engine step ran past --stage-timeout ({seconds:.1f} s)"
        health.report(distributed.StageFault(None, reason))

    _degrade_on_fault(health, state, err)
    state.add_collector(StageCollector(metrics))
    watchdog = distributed.StepWatchdog(timeout, on_overrun)
    return distributed.StageGuard(health, metrics, watchdog, reports=reports)


def guard_prefill(
    pair: DisaggregatedRank, state: ServerState, timeout: float, chunk: int, err: TextIO
) -> RemotePrefillFactory:
    """Rank 0's factory for where prompts are prefilled (rank 1), its faults degrading
    `state` as `guard_stages`' do: a prompt's KV that has not arrived `timeout` seconds
    per `chunk` tokens of the prompt after its job was sent (`PrefillDeadline`), and a
    failed link, count as rank 1's fault; `/metrics` shows the pair and the prefills.
    """
    import mlxcel_distributed as distributed
    from mlxcel_distributed.stage_guard import NAMING_GRACE_SECONDS

    health = pair.health
    prefill_rank = distributed.PREFILL_RANK

    def on_overrun(seconds: float) -> None:
        reason = (
            f"did not return a prompt's KV within {seconds:.1f} s "
            "(--stage-timeout per -ub chunk of the prompt)"
        )
        health.report(distributed.StageFault(prefill_rank, reason))

    def on_failure(error: BaseException) -> None:
        # A local rank's exit names itself with its exit code within milliseconds.
        if health.wait_for_fault(NAMING_GRACE_SECONDS) is None:
            health.report(distributed.StageFault(prefill_rank, f"cannot be reached: {error}"))

    metrics = distributed.PrefillMetrics()
    health.add_listener(lambda fault: metrics.record_down())
    _degrade_on_fault(health, state, err)
    state.add_collector(PrefillCollector(metrics))
    watchdog = distributed.StepWatchdog(timeout, on_overrun)
    deadline = distributed.PrefillDeadline(watchdog, chunk)
    return pair.make_remote_prefill(on_failure, metrics, deadline)


def _degrade_on_fault(health: StageHealth, state: ServerState, err: TextIO) -> None:
    """On `health`'s fault, print it on `err`; then degrade `state` once it serves, or end
    the process with status 1 while the model still loads."""

    def on_fault(fault: StageFault) -> None:
        print(f"mlxcel: error: {fault.summary}", file=err, flush=True)
        if not state.ready:
            os._exit(1)
        state.degrade(Degradation(fault.message, {"rank": fault.rank, "reason": fault.reason}))

    health.add_listener(on_fault)


def exit_now_if_degraded(rank: ParallelRank | DisaggregatedRank | None, code: int) -> None:
    """After the server's orderly stop, end a degraded rank 0 with `code` at once.

    Its engine thread may still be blocked inside a collective (its prefill link's thread
    inside a receive, under `--disaggregate`), and the C++ runtime aborts the process when
    it destroys such a thread at interpreter exit; `os._exit` skips that.
    """
    if rank is None or rank.health.fault is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
