"""The model runners of a pipeline's ranks: each step's passes cross each pair of
neighbouring stages in one transfer, and rank 0 keeps one step per stage in flight.

Rank 0 starts step k + 1 while the later stages still work on step k: it computes its own
layers for step k + 1, receives the logits of the oldest step it sent once as many steps
as the other stages can hold are out, then sends step k + 1's message and hidden states.
The engine samples step k while the last stage computes step k + 1; each step holds
sequences the steps in flight do not (`Sequence.in_step`), so with P stages the running
sequences take turns in P groups. Every rank does its transfers in step order, each
receive before the next send on rank 0, so a send that waits for its receive never waits
on a rank that is itself waiting to send.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlxcel_core.cache.layout import CacheLayout
from mlxcel_core.cache.paged import PagedKVStorage
from mlxcel_core.engine import ModelRunner, RowInput
from mlxcel_core.engine.runner import StepLogits, pass_groups, pass_tokens
from mlxcel_distributed.lockstep import LockstepRunner, asks_for_reports
from mlxcel_distributed.pipeline_stage import PipelineStage, StagePass
from mlxcel_distributed.stage_guard import StageGuard, timed
from mlxcel_distributed.stage_metrics import StageMetrics
from mlxcel_distributed.stage_reports import StageReport, read_reports
from mlxcel_distributed.step_channel import PipelineChannel


def _stage_passes(
    runner: ModelRunner, rows: Sequence[RowInput]
) -> tuple[list[list[int]], list[StagePass]]:
    """The step's passes (`pass_groups`) as the stage runs them, with their rows."""
    groups = pass_groups(rows)
    passes = []
    for members in groups:
        pass_rows = [rows[i] for i in members]
        last_only = pass_rows[0].num_logits == 1
        passes.append(StagePass(pass_tokens(pass_rows), runner.layer_caches(pass_rows), last_only))
    return groups, passes


def _step_logits(groups: Sequence[Sequence[int]], logits: Sequence[mx.array]) -> StepLogits:
    step = StepLogits()
    for members, pass_logits in zip(groups, logits, strict=True):
        step.add(members, pass_logits)
    return step


class StageRunner(ModelRunner):
    """A follower's runner for its pipeline stage: all of a step's passes in one call.

    Args:
        stage: this rank's stage.
        storage: this rank's KV pools (its own layers).
        report: takes this rank's report of each step once its output is computed, and
            returns what to send with the output, if anything (`PipelineChannel.report`);
            None to report nothing, each step's output then computed and sent in one
            evaluation.
    """

    def __init__(
        self,
        stage: PipelineStage,
        storage: PagedKVStorage,
        report: Callable[[StageReport], np.ndarray | None] | None = None,
    ) -> None:
        super().__init__(stage, storage)
        # A stage runs the attention layers of its storage, one cache each.
        self.layout = CacheLayout.all_attention(len(storage.layers))
        self.stage = stage
        self._report = report
        self._num_steps = 0

    def run(self, rows: Sequence[RowInput]) -> StepLogits:
        groups, passes = _stage_passes(self, rows)
        if self._report is None:
            return _step_logits(groups, self.stage.run_passes(passes))
        hidden = self.stage.receive_hidden(passes)
        lap = timed()
        output = self.stage.stage_output(hidden, passes)
        mx.eval(output, self.storage.arrays())
        self._num_steps += 1
        report = StageReport(self._num_steps, lap(), sum(array.nbytes for array in output))
        self.stage.send_output(output, self._report(report))
        return _step_logits(groups, self.stage.logits_of(output, passes))


@dataclass(frozen=True)
class _SentStep:
    """A step rank 0 has sent down the pipeline and not received the logits of."""

    groups: list[list[int]]
    shapes: list[tuple[int, int]]


class PipelineRunner(LockstepRunner):
    """Rank 0's runner over a pipeline: up to one step per stage in flight (see the module).

    Args:
        stage: rank 0's stage (the first layers).
        storage: rank 0's KV pools.
        channel: the pipeline's message channel.
        guard: the group's health, metrics and stage timeout; None runs steps unguarded.
    """

    def __init__(
        self,
        stage: PipelineStage,
        storage: PagedKVStorage,
        channel: PipelineChannel,
        guard: StageGuard | None = None,
    ) -> None:
        super().__init__(stage, storage, channel, guard)
        # A stage runs the attention layers of its storage, one cache each.
        self.layout = CacheLayout.all_attention(len(storage.layers))
        self._channel: PipelineChannel = channel
        self.stage = stage
        self.steps_in_flight = stage.num_stages
        self._sent: deque[_SentStep] = deque()
        # As the KV plan told the other ranks (`make_lockstep_runner_factory`).
        self._region_ints = channel.region_ints if asks_for_reports(guard) else 0
        self._received: deque[StepLogits] = deque()

    @property
    def num_started(self) -> int:
        return len(self._sent) + len(self._received)

    def run(self, rows: Sequence[RowInput]) -> StepLogits:
        """`start` then `finish`: one step, with no other in flight.

        Raises:
            RuntimeError: steps are in flight.
        """
        if self.num_started:
            raise RuntimeError("run() needs no other step in flight; use start() and finish()")
        self.start(rows)
        return self.finish()

    def start(self, rows: Sequence[RowInput]) -> None:
        """Compute rank 0's layers for the step and send it down the pipeline.

        Rank 0's own layers run outside the stage guard: an error there (an MLX
        allocation failure, say) fails this step alone, as it would in one process. A step
        whose logits could not be received while making room for this one is dropped
        (`num_started`); the steps still in the pipeline stay.

        Raises:
            EngineUnavailableError: the group is degraded, a rank is gone, or the step
                overran the stage timeout.
        """
        if self._guard is not None:
            self._guard.check()
        lap = timed()
        groups, passes = _stage_passes(self, rows)
        hidden = self.stage.first_hidden(passes)
        mx.eval(hidden, self.storage.arrays())
        step = _SentStep(groups, [(p.tokens.shape[0], p.num_logits) for p in passes])
        own = StageReport(self._count_step(), lap(), hidden.nbytes)
        self._guarded(lambda metrics: self._send(rows, step, hidden, own, metrics))

    def finish(self) -> StepLogits:
        """The oldest started step's logits, received from the last stage if need be; the
        step is consumed even when its logits cannot be received.

        Raises:
            IndexError: no step is started.
            EngineUnavailableError: a rank is gone or the step overran the stage timeout.
        """
        if self._received:
            return self._received.popleft()
        if not self._sent:
            raise IndexError("no step is started")
        sent = self._sent.popleft()
        return self._guarded(lambda metrics: self._receive(sent, metrics))

    def _send(
        self,
        rows: Sequence[RowInput],
        step: _SentStep,
        hidden: mx.array,
        own: StageReport,
        metrics: StageMetrics | None,
    ) -> None:
        lap = timed()
        # The other stages hold steps_in_flight - 1 steps; the last one sends the oldest's
        # logits before it takes this step's message.
        while len(self._sent) >= self.steps_in_flight - 1:
            self._received.append(self._receive(self._sent.popleft(), metrics))
        forward_seconds = own.seconds + lap()
        nbytes = self._channel.send(self._take_message(rows)).nbytes
        channel_seconds = lap()
        self.stage.send_hidden(hidden)
        self._sent.append(step)
        if metrics is not None:
            metrics.record_step(channel_seconds, forward_seconds + lap(), nbytes)
            metrics.record_reports({0: own})

    def _receive(self, sent: _SentStep, metrics: StageMetrics | None) -> StepLogits:
        logits, region = self.stage.receive_logits(sent.shapes, self._region_ints)
        if metrics is not None:
            metrics.record_reports(read_reports(region))
        return _step_logits(sent.groups, logits)
