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
from mlxcel_core.language_model import LanguageModel
from mlxcel_distributed.stage_guard import StageGuard, timed
from mlxcel_distributed.stage_metrics import StageMetrics
from mlxcel_distributed.stage_reports import StageReport
from mlxcel_distributed.step_channel import Channel
from mlxcel_distributed.step_messages import StepMessage

T = TypeVar("T")


def asks_for_reports(guard: StageGuard | None) -> bool:
    """Whether rank 0 under `guard` asks the other ranks to report their steps (the KV
    plan says so); unguarded, it records nothing to report into."""
    return guard is not None and guard.reports


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

    # The followers run the same rows from the step message: they need the token ids.
    takes_pending_tokens = False

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
        self._num_blocks: tuple[int, ...] = ()
        self._copies: tuple[BlockCopy, ...] = ()
        self._num_steps = 0

    def prepare_storage(self, num_blocks: Sequence[int], copies: Sequence[BlockCopy]) -> None:
        super().prepare_storage(num_blocks, copies)
        self._num_blocks = tuple(num_blocks)
        self._copies = (*self._copies, *copies)  # with any a failed step never sent

    def run(self, rows: Sequence[RowInput]) -> StepLogits:
        """Send the step, then compute it, evaluating the logits and the KV writes.

        Raises:
            ValueError: a row carries LoRA adapter scales.
            EngineUnavailableError: a rank is gone or the step overran the stage timeout
                (this step's collectives failed, or an earlier step's did).
        """
        return self._guarded(lambda metrics: self._send_and_compute(rows, metrics))

    def _send_and_compute(
        self, rows: Sequence[RowInput], metrics: StageMetrics | None
    ) -> StepLogits:
        lap = timed()
        sent = self._channel.send(self._take_message(rows))
        channel_seconds = lap()
        step = self._compute(rows)
        forward_seconds = lap()
        if metrics is not None:
            metrics.record_step(channel_seconds, forward_seconds, sent.nbytes)
            own = StageReport(self._count_step(), forward_seconds, 0)
            metrics.record_reports({0: own, **sent.reports})
        return step

    def _count_step(self) -> int:
        """Rank 0's steps sent, this one included."""
        self._num_steps += 1
        return self._num_steps

    def _guarded(self, body: Callable[[StageMetrics | None], T]) -> T:
        """`body(metrics)` under the guard (see `StageGuard.step`), or `body(None)`
        unguarded, without one."""
        guard = self._guard
        if guard is None:
            return body(None)
        guard.check()
        with guard.step() as metrics:
            return body(metrics)

    def _take_message(self, rows: Sequence[RowInput]) -> StepMessage:
        message = StepMessage(self._num_blocks, self._copies, tuple(rows))
        self._copies = ()
        return message

    def _compute(self, rows: Sequence[RowInput]) -> StepLogits:
        step = super().run(rows)
        evaluate_step(step, len(rows), self.storage)
        return step
