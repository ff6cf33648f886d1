"""The engine's steps run in lockstep over a tensor- or pipeline-parallel group.

Rank 0 owns the engine (scheduler, KV manager, sampler); its runner sends each step's rows
to the other ranks before running them. The other ranks (followers) run the same forward
passes over their own part of the model (a shard of every layer, or a pipeline stage) and
their own KV caches, never sampling. Each sharded layer ends in an all-sum, and each stage
sends to the next, so every rank must evaluate the same graph in the same order: both
sides evaluate a step's logits and KV writes together, in one `mx.eval` of the same arrays,
inside the runner (rank 0's engine then samples from logits already computed).
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx

from mlxcel_core.adapters import RowAdapterScales
from mlxcel_core.cache.paged import BlockCopy, PagedKVStorage
from mlxcel_core.engine import EngineConfig, ModelRunner, RowInput, RunnerFactory
from mlxcel_core.engine.config import make_kv_storage
from mlxcel_core.engine.memory import profile_model
from mlxcel_core.engine.runner import StepLogits
from mlxcel_core.generate import LanguageModel
from mlxcel_distributed.stage_guard import StageGuard, timed
from mlxcel_distributed.step_channel import StepChannel
from mlxcel_distributed.step_messages import KVPlan, Shutdown, StepMessage


class LockstepError(RuntimeError):
    """A follower received a message out of order (rank 0 and it have diverged)."""


def _evaluate(step: StepLogits, num_rows: int, storage: PagedKVStorage) -> None:
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
        channel: StepChannel,
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
        self._copies = tuple(copies)

    def run(self, rows: Sequence[RowInput]) -> StepLogits:
        """Send the step, then compute it, evaluating the logits and the KV writes.

        Raises:
            ValueError: a row carries LoRA adapter scales.
            EngineUnavailableError: a rank is gone or the step overran the stage timeout
                (this step's collectives failed, or an earlier step's did).
        """
        guard = self._guard
        if guard is None:
            return self._run_step(rows)
        guard.check()
        with guard.step() as record:
            lap = timed()
            nbytes = self._channel.send(self._take_message(rows))
            channel_seconds = lap()
            step = self._compute(rows)
            record(channel_seconds, lap(), nbytes)
        return step

    def _run_step(self, rows: Sequence[RowInput]) -> StepLogits:
        self._channel.send(self._take_message(rows))
        return self._compute(rows)

    def _take_message(self, rows: Sequence[RowInput]) -> StepMessage:
        message = StepMessage(self._num_blocks, self._copies, tuple(rows))
        self._copies = ()
        return message

    def _compute(self, rows: Sequence[RowInput]) -> StepLogits:
        step = super().run(rows)
        _evaluate(step, len(rows), self.storage)
        return step


def make_lockstep_runner_factory(
    channel: StepChannel, guard: StageGuard | None = None
) -> RunnerFactory:
    """The `Engine(make_runner=...)` factory of rank 0: it sends the KV plan (the number of
    blocks the engine sized its cache to) and returns a `LockstepRunner` under `guard`
    (None: unguarded).

    The factory raises `ValueError` for a model with unfused LoRA adapters.
    """

    def make_runner(
        model: LanguageModel, storage: PagedKVStorage, adapters: RowAdapterScales | None
    ) -> ModelRunner:
        if adapters is not None:
            raise ValueError("lockstep ranks do not support unfused LoRA adapters")
        channel.send(KVPlan(storage.max_blocks))
        return LockstepRunner(model, storage, channel, guard)

    return make_runner


def follow_steps(model: LanguageModel, config: EngineConfig, channel: StepChannel) -> int:
    """A follower's whole engine life: replay rank 0's profile pass, build the KV pools it
    planned, then run each step it sends until it shuts down.

    Args:
        model: this rank's shard of the model.
        config: the engine settings rank 0 runs with (prefill chunk, block size, cache types).
        channel: the group's step channel.

    Returns:
        The number of steps run.

    Raises:
        LockstepError: a message came out of order.
    """
    profile = profile_model(model, config.scheduler.max_prefill_chunk)
    plan = channel.receive()
    if isinstance(plan, Shutdown):
        return 0
    if not isinstance(plan, KVPlan):
        raise LockstepError(f"expected the KV plan from rank 0, got {type(plan).__name__}")
    storage = make_kv_storage(config, profile, plan.num_blocks)
    runner = ModelRunner(model, storage)
    num_steps = 0
    while not isinstance(message := channel.receive(), Shutdown):
        if not isinstance(message, StepMessage):
            raise LockstepError(f"expected a step from rank 0, got {type(message).__name__}")
        runner.prepare_storage(message.num_blocks, message.copies)
        _evaluate(runner.run(message.rows), len(message.rows), storage)
        num_steps += 1
    return num_steps
