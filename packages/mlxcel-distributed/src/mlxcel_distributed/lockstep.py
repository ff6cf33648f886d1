"""The engine's steps run in lockstep over a tensor- or pipeline-parallel group.

Rank 0 owns the engine (scheduler, KV manager, sampler); its runner sends each step's rows
to the other ranks before running them. The other ranks (followers) run the same forward
passes over their own part of the model (a shard of every layer, or a pipeline stage) and
their own KV caches, never sampling. Each sharded layer ends in an all-sum, and each stage
sends to the next, so every rank must evaluate the same graph in the same order: both
sides evaluate a step's logits and KV writes together, in one `mx.eval` of the same arrays,
inside the runner (rank 0's engine then samples from logits already computed). Over a
pipeline, rank 0's runner splits that in two so that several steps are in flight
(`pipeline_runner`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import mlx.core as mx

from mlxcel_core.cache.paged import BlockCopy, PagedKVStorage
from mlxcel_core.engine import ModelRunner, RowInput
from mlxcel_core.engine.runner import StepLogits
from mlxcel_core.generate import LanguageModel
from mlxcel_distributed.stage_guard import StageGuard, timed
from mlxcel_distributed.step_channel import Channel
from mlxcel_distributed.step_messages import StepMessage

T = TypeVar("T")

StepRecord = Callable[[float, float, int], None]
"""Records a step's channel seconds, forward seconds and bytes sent (`StageGuard.step`)."""


def _unrecorded(channel_seconds: float, forward_seconds: float, nbytes: int) -> None:
    pass


def evaluate_step(step: StepLogits, num_rows: int, storage: PagedKVStorage) -> None:
    """Evaluate a step's logits and KV writes together, as every rank must."""
    mx.eval([step.row(i) for i in range(num_rows)], storage.arrays())


class LockstepRunner(ModelRunner):
    """Rank 0's model runner: sends every step to the followers, then runs it with them.

    Args:
        model: rank 0's shard of the model.
        storage: rank 0's KV pools (its own KV heads).
        channel: the group's step channel.
        guard: the group's health, metrics and stage timeout; None runs steps unguarded.
    """

    def __init__(
        self,
        model: LanguageModel,
        storage: PagedKVStorage,
        channel: Channel,
        guard: StageGuard | None = None,
    ) -> None:
        super().__init__(model, storage)
        self._channel = channel
        self._guard = guard
        self._num_blocks = 0
        self._copies: tuple[BlockCopy, ...] = ()

    def prepare_storage(self, num_blocks: int, copies: Sequence[BlockCopy]) -> None:
        super().prepare_storage(num_blocks, copies)
        self._num_blocks = num_blocks
        self._copies = (*self._copies, *copies)  # with any a failed step never sent

    def run(self, rows: Sequence[RowInput]) -> StepLogits:
        """Send the step, then compute it, evaluating the logits and the KV writes.

        Raises:
            ValueError: a row carries LoRA adapter scales.
            EngineUnavailableError: a rank is gone or the step overran the stage timeout
                (this step's collectives failed, or an earlier step's did).
        """
        return self._guarded(lambda record: self._send_and_compute(rows, record))

    def _send_and_compute(self, rows: Sequence[RowInput], record: StepRecord) -> StepLogits:
        lap = timed()
        nbytes = self._channel.send(self._take_message(rows))
        channel_seconds = lap()
        step = self._compute(rows)
        record(channel_seconds, lap(), nbytes)
        return step

    def _guarded(self, body: Callable[[StepRecord], T]) -> T:
        """`body(record)` under the guard (see `StageGuard.step`), or unguarded without one."""
        guard = self._guard
        if guard is None:
            return body(_unrecorded)
        guard.check()
        with guard.step() as record:
            return body(record)

    def _take_message(self, rows: Sequence[RowInput]) -> StepMessage:
        message = StepMessage(self._num_blocks, self._copies, tuple(rows))
        self._copies = ()
        return message

    def _compute(self, rows: Sequence[RowInput]) -> StepLogits:
        step = super().run(rows)
        evaluate_step(step, len(rows), self.storage)
        return step
