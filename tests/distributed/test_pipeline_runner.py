"""Rank 0's `PipelineRunner` in one process, over a stand-in stage and channel that record
the order of its transfers: what it sends and receives when, which steps it still holds
after each kind of failure, and what it records of every stage's reports."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np
import pytest

from mlxcel_core.cache.paged import PagedKVStorage
from mlxcel_core.engine import EngineUnavailableError, RowInput
from mlxcel_core.engine.memory import profile_model
from mlxcel_distributed import (
    PipelineRunner,
    Sent,
    StageGuard,
    StageHealth,
    StageMetrics,
    StageReport,
)
from mlxcel_distributed.stage_reports import region_size, write_report
from mlxcel_models.loading.loader import load_model

VOCAB = 11
BLOCK_SIZE = 4


class RecordingStage:
    """Stands in for rank 0's stage of two: logs each call; each step's logits carry its
    number, so a test can tell whose logits it got."""

    num_stages = 2

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.computed = 0
        self.fail_compute = False
        self.fail_receive = False
        self.received = 0

    def first_hidden(self, passes: Sequence) -> mx.array:
        self.computed += 1
        self.log.append(f"compute {self.computed}")
        if self.fail_compute:
            raise RuntimeError("out of memory on rank 0")
        return mx.full((sum(p.tokens.size for p in passes), 4), float(self.computed))

    def send_hidden(self, hidden: mx.array) -> None:
        self.log.append(f"send {int(hidden[0, 0].item())}")

    def receive_logits(
        self, sizes: Sequence[tuple[int, int]], trailer_ints: int
    ) -> tuple[list[mx.array], np.ndarray]:
        """Each step's logits, and after them rank 1's report of a step: steps 1, 1, 2, 2...
        (a report of a step already recorded must count once)."""
        self.log.append("receive")
        if self.fail_receive:
            raise RuntimeError("connection to a peer was lost")
        self.received += 1
        steps = (self.received + 1) // 2
        region = np.zeros(trailer_ints, dtype=np.int32)
        write_report(region, 1, StageReport(steps, 0.02 * steps, 1000))
        return [mx.zeros((b, n, VOCAB)) for b, n in sizes], region


class RecordingChannel:
    region_ints = region_size(2)

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def send(self, message) -> Sent:
        self.log.append(f"message of {len(message.rows)} rows")
        return Sent(4)


@pytest.fixture(scope="module")
def storage(tiny_safetensors) -> PagedKVStorage:
    profile = profile_model(load_model(tiny_safetensors).model, 8)
    storage = PagedKVStorage(profile.layers, BLOCK_SIZE, 16)
    storage.ensure_capacity(16)
    return storage


def make_runner(
    storage: PagedKVStorage, health: StageHealth | None = None
) -> tuple[PipelineRunner, RecordingStage, list[str]]:
    log: list[str] = []
    stage = RecordingStage(log)
    guard = StageGuard(health or StageHealth(), StageMetrics(2, stages_send=True))
    return PipelineRunner(stage, storage, RecordingChannel(log), guard), stage, log


def rows(count: int) -> list[RowInput]:
    return [RowInput([5], ([1 + i],), 3) for i in range(count)]


def test_rank_0_receives_the_oldest_step_before_it_sends_the_next(storage):
    runner, _, log = make_runner(storage)
    runner.start(rows(2))
    runner.start(rows(1))
    assert runner.num_started == 2
    first, second = runner.finish(), runner.finish()
    assert log == [
        "compute 1",
        "message of 2 rows",
        "send 1",
        "compute 2",
        "receive",  # step 1's logits, before step 2 goes down the pipeline
        "message of 1 rows",
        "send 2",
        "receive",  # step 2's, when the engine asks for them
    ]
    assert first.last([0, 1]).shape == (2, VOCAB) and second.last([0]).shape == (1, VOCAB)
    assert runner.num_started == 0


def test_a_local_failure_before_the_send_fails_that_step_alone(storage):
    health = StageHealth()
    runner, stage, log = make_runner(storage, health)
    runner.start(rows(2))
    stage.fail_compute = True
    with pytest.raises(RuntimeError, match="out of memory"):
        runner.start(rows(1))
    assert health.fault is None  # no rank was lost
    assert runner.num_started == 1
    assert runner.finish().last([0, 1]).shape == (2, VOCAB)
    assert log[-1] == "receive" and "message of 1 rows" not in log


def test_a_lost_receive_consumes_its_step_and_degrades_the_group(storage):
    runner, stage, _ = make_runner(storage)
    runner.start(rows(2))
    stage.fail_receive = True
    with pytest.raises(EngineUnavailableError, match="collective failed"):
        runner.finish()
    assert runner.num_started == 0
    with pytest.raises(EngineUnavailableError):
        runner.start(rows(1))


def test_a_lost_receive_while_making_room_drops_the_oldest_step(storage):
    runner, stage, log = make_runner(storage)
    runner.start(rows(2))
    stage.fail_receive = True
    with pytest.raises(EngineUnavailableError):
        runner.start(rows(1))
    assert runner.num_started == 0  # step 1 is lost, step 2 never went out
    assert "message of 1 rows" not in log


def test_every_stage_s_step_is_recorded_once_with_the_bytes_it_sent(storage):
    log: list[str] = []
    metrics = StageMetrics(2, stages_send=True)
    guard = StageGuard(StageHealth(), metrics)
    runner = PipelineRunner(RecordingStage(log), storage, RecordingChannel(log), guard)
    for _ in range(4):
        runner.start(rows(2))
        runner.finish()
    snapshot = metrics.snapshot()
    # Rank 0: its own layers' time per step, and two rows of 4 float32 hidden features.
    assert snapshot.stage_seconds[0].buckets[-1][1] == 4
    assert snapshot.stage_sent_bytes[0] == 4 * 2 * 4 * 4
    # Rank 1 reported steps 1, 1, 2, 2: each counted once.
    assert snapshot.stage_seconds[1].buckets[-1][1] == 2
    assert snapshot.stage_seconds[1].total == pytest.approx(0.02 + 0.04)
    assert snapshot.stage_sent_bytes[1] == 2000
