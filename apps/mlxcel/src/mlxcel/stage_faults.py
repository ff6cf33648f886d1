"""`--stage-timeout`: how `mlxcel serve --tp N` (or `--pp N`) stays up when a rank dies or hangs.

Rank 0 watches its ranks two ways: the exit of a rank it started itself (seen at once), and
a deadline on every engine step (a hung rank, and at times a dead one, blocks rank 0's
collectives for good). Either makes the server degraded: requests in flight end with an
error, new ones get 503, and `/health` answers 503 with the rank and the reason. A rank
that fails while the model loads still ends the command with one line.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, TextIO

from mlxcel.flags import Flag, UsageError
from mlxcel.parallel_flags import ParallelRank
from mlxcel_server import ServerState
from mlxcel_server.stage_metrics import StageCollector
from mlxcel_server.state import Degradation

if TYPE_CHECKING:
    from mlxcel_distributed import StageFault, StageGuard

STAGE_TIMEOUT_FLAG = Flag(
    ("--stage-timeout",),
    "stage_timeout",
    float,
    30.0,
    "with --tp or --pp: seconds an engine step may take before its ranks count as hung and the "
    "server answers 503",
    env="MLXCEL_STAGE_TIMEOUT",
)


def check_stage_timeout(args: argparse.Namespace) -> None:
    """Raises `UsageError` when `--stage-timeout` is not a positive number of seconds."""
    if not args.stage_timeout > 0:
        raise UsageError(f"--stage-timeout must be > 0 seconds, got {args.stage_timeout}")


def guard_stages(rank: ParallelRank, state: ServerState, timeout: float, err: TextIO) -> StageGuard:
    """The stage guard of rank 0's engine: a step past `timeout` seconds counts as a hung
    rank; a fault degrades `state` once it serves (ending the requests in flight, though
    the engine thread may stay blocked), and `/metrics` shows the group.
    """
    import mlxcel_distributed as distributed

    health = rank.health
    metrics = distributed.StageMetrics(rank.size)

    def on_overrun(seconds: float) -> None:
        reason = f"an engine step ran past --stage-timeout ({seconds:.1f} s)"
        health.report(distributed.StageFault(None, reason))

    def on_fault(fault: StageFault) -> None:
        print(f"mlxcel: error: {fault.summary}", file=err, flush=True)
        if not state.ready:
            os._exit(1)
        state.degrade(Degradation(fault.message, {"rank": fault.rank, "reason": fault.reason}))

    health.add_listener(on_fault)
    state.add_collector(StageCollector(metrics))
    watchdog = distributed.StepWatchdog(timeout, on_overrun)
    return distributed.StageGuard(health, metrics, watchdog)


def exit_now_if_degraded(rank: ParallelRank | None, code: int) -> None:
    """After the server's orderly stop, end a degraded rank 0 with `code` at once.

    Its engine thread may still be blocked inside a collective, and the C++ runtime aborts
    the process when it destroys such a thread at interpreter exit; `os._exit` skips that.
    """
    if rank is None or rank.health.fault is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
