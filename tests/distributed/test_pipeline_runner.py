"""Rank 0's `PipelineRunner` in one process, over a stand-in stage and channel that record
the order of its transfers: what it sends and receives when, and which steps it still holds
after each kind of failure."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import pytest

from mlxcel_core.cache.paged import PagedKVStorage
from mlxcel_core.engine import EngineUnavailableError, RowInput
from mlxcel_core.engine.memory import profile_model
from mlxcel_distributed import PipelineRunner, StageGuard, StageHealth, StageMetrics
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

    def first_hidden(self, passes: Sequence) -> mx.array:
        self.computed += 1
        self.log.append(f"compute {self.computed}")
        if self.fail_compute:
            raise RuntimeError("out of memory on rank 0")
        return mx.full((sum(p.tokens.size for p in passes), 4), float(self.computed))

    def send_hidden(self, hidden: mx.array) -> None:
        self.log.append(f"send {int(hidden[0, 0].item())}")

    def receive_logits(self, sizes: Sequence[tuple[int, int]]) -> list[mx.array]:
        self.log.append("receive")
        if self.fail_receive:
            raise RuntimeError("connection to a peer was lost")
        return [mx.zeros((b, n, VOCAB)) for b, n in sizes]


class RecordingChannel:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def send(self, message) -> int:
        self.log.append(f"message of {len(message.rows)} rows")
        return 4


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
    guard = StageGuard(health or StageHealth(), StageMetrics(2))
    return PipelineRunner(stage, storage, RecordingChannel(log), guard), stage, log


def rows(count: int) -> list[RowInput]:
    return [RowInput([5], [1 + i], 3) for i in range(count)]


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
