"""Rank 0's fault handling without a group: the step watchdog, the group's health, the
stage guard around a step, and the step metrics, on fakes."""

from __future__ import annotations

import threading

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_core.engine import EngineUnavailableError, RowInput
from mlxcel_distributed import (
    Sent,
    StageFault,
    StageGuard,
    StageHealth,
    StageMetrics,
    StepChannel,
    StepWatchdog,
)
from mlxcel_distributed.stage_guard import NAMING_GRACE_SECONDS
from mlxcel_distributed.stage_metrics import STEP_SECONDS_BUCKETS
from mlxcel_distributed.step_channel import FRAME_INTS
from mlxcel_distributed.step_messages import Shutdown, StepMessage, encode_message

# Bounds every wait on another thread, so a broken watchdog fails instead of hanging.
WAIT_SECONDS = 10.0


def test_a_step_past_the_timeout_is_reported_once_while_it_still_runs():
    overruns = []
    reported = threading.Event()

    def on_overrun(seconds: float) -> None:
        overruns.append(seconds)
        reported.set()

    watchdog = StepWatchdog(0.05, on_overrun)
    with watchdog.step():
        assert reported.wait(WAIT_SECONDS)
    with watchdog.step():
        pass
    watchdog.close()
    assert len(overruns) == 1 and overruns[0] >= 0.05


def test_steps_within_the_timeout_are_never_reported():
    overruns = []
    watchdog = StepWatchdog(WAIT_SECONDS, overruns.append)
    for _ in range(3):
        with watchdog.step():
            pass
    watchdog.close()
    assert overruns == []


def test_the_timeout_must_be_positive():
    with pytest.raises(ValueError, match="timeout must be > 0 seconds, got 0"):
        StepWatchdog(0, print)


def test_the_first_fault_wins_and_reaches_every_listener_once():
    health = StageHealth()
    early = []
    health.add_listener(early.append)
    assert health.wait_for_fault(0) is None
    health.report(StageFault(2, "exited with code -9"))
    health.report(StageFault(None, "a collective failed"))
    late = []
    health.add_listener(late.append)
    assert early == late == [StageFault(2, "exited with code -9")]
    assert health.fault.message == (
        "a rank of the model is unavailable: rank 2 exited with code -9; restart the server"
    )


def _failing_step(guard: StageGuard) -> EngineUnavailableError:
    with pytest.raises(EngineUnavailableError) as raised, guard.step():
        raise RuntimeError("[ring] connection to a peer was lost")
    return raised.value


def test_a_failed_collective_takes_the_rank_a_watcher_reports():
    health = StageHealth()
    guard = StageGuard(health, StageMetrics(3))
    watcher = threading.Timer(0.01, health.report, [StageFault(1, "exited with code -9")])
    watcher.start()
    error = _failing_step(guard)
    watcher.join()
    assert "rank 1 exited with code -9" in str(error)
    with pytest.raises(EngineUnavailableError, match="rank 1 exited"):
        guard.check()
    assert guard.metrics.snapshot().down_rank == 1


def test_a_failed_collective_no_watcher_names_is_an_unnamed_fault():
    guard = StageGuard(StageHealth(), StageMetrics(3))
    error = _failing_step(guard)
    assert "a collective failed: [ring] connection to a peer was lost" in str(error)
    assert guard.health.fault.rank is None and guard.metrics.snapshot().down_rank == -1
    assert NAMING_GRACE_SECONDS > 0


def test_a_guarded_step_feeds_the_watchdog_and_records_its_measurements():
    overruns = []
    guard = StageGuard(StageHealth(), StageMetrics(3), StepWatchdog(WAIT_SECONDS, overruns.append))
    with guard.step() as metrics:
        metrics.record_step(0.002, 0.3, 1024)
    guard.check()
    snapshot = guard.metrics.snapshot()
    assert snapshot.channel_bytes == 1024 and snapshot.down_rank is None
    channel = dict(snapshot.channel_seconds.buckets)
    assert channel[0.001] == 0 and channel[0.005] == 1 and channel[float("inf")] == 1
    forward = dict(snapshot.forward_seconds.buckets)
    assert forward[0.25] == 0 and forward[0.5] == 1 and snapshot.forward_seconds.total == 0.3
    assert len(forward) == len(STEP_SECONDS_BUCKETS) + 1 and overruns == []


def test_send_returns_the_bytes_of_its_frames():
    channel = StepChannel(mx.distributed.init())  # a group of one: rank 0 alone
    int_bytes = np.dtype(np.int32).itemsize
    assert channel.send(Shutdown()) == Sent(FRAME_INTS * int_bytes)
    prefill = StepMessage((20,), (), (RowInput(list(range(600)), (list(range(20)),), 0, 1),))
    rest = len(encode_message(prefill)) - (FRAME_INTS - 1)
    assert rest > 0
    assert channel.send(prefill) == Sent((FRAME_INTS + rest) * int_bytes)
