"""The engine's step loop on one thread, without threads or locks: `EngineCore.step()`.

Each step: schedule (which sequences compute how many tokens) → build (drafts with
speculative decoding, then the runner's rows) → launch (the batched forward passes over
the paged KV cache, and the draws that sample every row that reached its last token, rows
whose chains need no per-row work drawing together) → collect (read the oldest step's
tokens, then update and emit). Requests join and leave between steps; chunked prefill
shares steps with decode.

With async scheduling (`EngineConfig.async_scheduling`), a step is collected one step
late: step k + 1 is scheduled, built and launched while the device still computes step k,
as vLLM v1's async scheduling and mlx-lm's `mx.async_eval` loop do. A decode row of step
k + 1 takes step k's token on the device (`RowInput.pending`), so emission, stop strings
and cancellation run one step behind, and a row that step k finished has its step k + 1
token discarded. A sequence whose sampling reads its tokens on the host (a constraint,
DRY) does not run ahead: the step that holds it is read before the next is planned.
Speculative decoding and runners that send their rows elsewhere run synchronously. On the
CPU, where `mx.async_eval` returns only near the end of a graph, step k + 1 is built while
step k finishes but handed to MLX once step k is read (docs/adr/0031).

A runner that keeps several steps in flight (`ModelRunner.steps_in_flight`: pipeline
stages, each working on a different step) gets the next step started before the oldest is
sampled; each step then holds sequences the steps in flight do not, so the running
sequences take turns, as in vLLM's pipeline-parallel virtual engines.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Seq

import mlx.core as mx

from mlxcel_core.adapters import RowAdapterScales
from mlxcel_core.cache.paged import InvariantError
from mlxcel_core.engine.admission import GroupPrompt, Submission, group_prompt, make_sequence
from mlxcel_core.engine.config import EngineConfig
from mlxcel_core.engine.emission import emit_token
from mlxcel_core.engine.parts import RunnerFactory, make_engine_parts
from mlxcel_core.engine.remote_prefill import PrefillDispatch, PrefilledKV, RemotePrefillFactory
from mlxcel_core.engine.request import (
    EngineError,
    EngineOutput,
    RequestCancelledError,
)
from mlxcel_core.engine.row_sampling import BatchDraw, Draw
from mlxcel_core.engine.scheduler import SchedulerOutput
from mlxcel_core.engine.sequence import Sequence, SequenceStatus
from mlxcel_core.engine.stats import EngineStats, make_engine_stats
from mlxcel_core.engine.step import (
    StartedStep,
    append_tokens,
    can_run_ahead,
    hold_pending,
    make_draws,
    make_rows,
    needs_host_tokens,
    samples_per_row,
)
from mlxcel_core.language_model import LanguageModel
from mlxcel_core.speculative import AcceptanceRule, DraftProposal

logger = logging.getLogger(__name__)


__all__ = ["EngineCore", "GroupPrompt", "RunnerFactory", "Submission"]


class EngineCore:
    """The scheduler, KV cache, runner and sampling of one engine, stepped by its caller.

    Construction profiles the model and sizes the KV cache. Every method must be called
    from one thread (the engine's, or a test's), which owns the MLX stream they use.

    Args:
        model: the language model; its weights must already be evaluated.
        config: limits and cache settings; `self.config` is it as run, its prefill chunk
            lowered to what `max_prefill_seconds` allows at the speed measured at start.
        draft_model: the draft model when `config.speculative` asks for one.
        adapters: the model's unfused LoRA adapters, or None.
        make_runner: builds the model runner once the KV storage exists; None builds a
            plain `ModelRunner`.
        make_remote_prefill: builds where new prompts are prefilled instead of here
            (disaggregated prefill), given the storage and `deliver`; None prefills here.
        deliver: where the remote prefill hands arrived KV (called on its own thread);
            needed with `make_remote_prefill`.

    Raises:
        InsufficientMemoryError: the KV budget cannot hold one sequence of `context_size`.
        ValueError: the model stores no keys and values, the draft model has another
            vocabulary size, `make_remote_prefill` comes without `deliver`, or speculative
            decoding or disaggregated prefill is asked of a model with recurrent state
            layers.
    """

    def __init__(
        self,
        model: LanguageModel,
        config: EngineConfig,
        *,
        draft_model: LanguageModel | None = None,
        adapters: RowAdapterScales | None = None,
        make_runner: RunnerFactory | None = None,
        make_remote_prefill: RemotePrefillFactory | None = None,
        deliver: Callable[[PrefilledKV], None] | None = None,
    ) -> None:
        self._adapters = adapters
        parts = make_engine_parts(
            model,
            config,
            draft_model=draft_model,
            adapters=adapters,
            make_runner=make_runner,
            make_remote_prefill=make_remote_prefill,
            deliver=deliver,
        )
        self.config = config = parts.config
        self._kv = parts.kv
        self._storage, self._storages = parts.storages[0], parts.storages
        self._scheduler = parts.scheduler
        self._runner = parts.runner
        self._speculation = parts.speculation
        self._prefill: PrefillDispatch | None = None
        if parts.remote_prefill is not None:
            self._prefill = PrefillDispatch(
                parts.remote_prefill, self._kv, self._storage, self._scheduler
            )
        self._runs_ahead = (
            config.async_scheduling
            and config.speculative is None
            and self._runner.steps_in_flight == 1
            and self._runner.takes_pending_tokens
        )
        self._depth = 2 if self._runs_ahead else self._runner.steps_in_flight
        # MLX's CPU `async_eval` returns only once all but the tail of a graph has run
        # (docs/benchmarks.md): handing it step k + 1 before reading step k would hold
        # step k's tokens back a whole step. There the next step is built first and
        # handed over once the step before is read.
        self._hands_over_after_reading = (
            self._runs_ahead and mx.default_device().type == mx.DeviceType.cpu
        )
        self._in_flight: deque[StartedStep] = deque()
        self._consecutive_failures = 0
        self._num_draft_tokens = 0
        self._num_accepted_draft_tokens = 0
        self.can_step = True
        self.failure: BaseException | None = None

    @property
    def runs_ahead(self) -> bool:
        """Whether steps are scheduled one ahead of the step being read (see the module)."""
        return self._runs_ahead

    @property
    def has_work(self) -> bool:
        return self._scheduler.has_work or bool(self._in_flight)

    @property
    def sequences(self) -> list[Sequence]:
        """The waiting and running sequences."""
        return [*self._scheduler.waiting, *self._scheduler.running]

    def stats(self) -> EngineStats:
        """A snapshot of the engine's state between steps."""
        return make_engine_stats(
            self._scheduler,
            self._kv,
            self._storage,
            num_draft_tokens=self._num_draft_tokens,
            num_accepted_draft_tokens=self._num_accepted_draft_tokens,
        )

    def admit(self, submission: Submission, firsts: dict[GroupPrompt, Sequence]) -> None:
        """Queue a new sequence; a later choice of a prompt forks from its first choice
        (of the same adapter scales, whose KV it can share). A group arrives whole, so
        `firsts`, shared by one call's arrivals, holds each prompt's first choice."""
        sequence = make_sequence(submission, self.config.context_size, self._adapters)
        if sequence is None:
            return
        if sequence.num_prompt_tokens > 1:
            key = group_prompt(sequence)
            sequence.fork_parent = firsts.get(key)
            firsts.setdefault(key, sequence)
        self._scheduler.add(sequence)

    def end_cancelled(self) -> None:
        """End the cancelled sequences that no step in flight holds (one that a step holds
        ends once the steps holding it are read: its KV is being written)."""
        for sequence in self.sequences:
            if sequence.handle.cancelled and not sequence.in_step:
                self._scheduler.finish(sequence, SequenceStatus.FINISHED_ABORTED)
                error = RequestCancelledError("the request was cancelled")
                sequence.sink.put(EngineOutput(sequence.request.index, error=error))

    def adopt_prefilled(self, kv: PrefilledKV) -> None:
        """Write arrived prompt KV into its sequence's blocks (disaggregated prefill),
        unless the sequence ended or was preempted since its job was sent."""
        if self._prefill is not None:
            self._prefill.adopt(kv)

    def step(self) -> None:
        """Schedule, build and launch the next step, then collect the oldest step in
        flight once the runner (or async scheduling) holds as many as it may, or once no
        sequence is left to start one with.

        Raises:
            InvariantError: the bookkeeping broke; the engine cannot go on. A failing
                model or MLX call fails its step's requests instead.
        """
        if self._in_flight:
            latest = self._in_flight[-1]
            if latest.blocks_next:
                self._collect_oldest()
                if not self.has_work:
                    return
            for item in latest.plan.scheduled:
                if item.sequence.handle.cancelled:
                    item.sequence.runs_ahead = False  # it ends once its step is read
        plan = self._scheduler.schedule(self._step_seqs_cap())
        if plan.remote and self._prefill is not None:
            self._prefill.send(plan.remote)
        if plan.scheduled:
            self._launch(plan)
        elif not self._in_flight:
            if plan.remote or self._scheduler.num_in_flight:
                self.can_step = False  # every unfinished sequence waits on KV in flight
                return
            raise InvariantError(
                f"no sequence could be scheduled with {len(self._scheduler.waiting)} waiting "
                f"and {len(self._scheduler.running)} running"
            )
        if self._in_flight and (not plan.scheduled or len(self._in_flight) >= self._depth):
            self._collect_oldest()
        if self._in_flight and not self._in_flight[-1].handed_over:
            self._hand_over(self._in_flight[-1])

    def drain(self) -> None:
        """Finish the steps still in flight without reading them, so that no rank is left
        sending their logits and no work is left on the stream when the engine stops."""
        while self._runner.num_started:
            try:
                self._runner.finish()
            except Exception as error:
                logger.warning("a step in flight failed while the engine stopped: %s", error)
        for started in self._in_flight:
            if started.draws is not None:
                try:
                    mx.eval(_draw_arrays(started.draws))
                except Exception as error:
                    logger.warning("a step in flight failed while the engine stopped: %s", error)
        self._in_flight.clear()

    def close_all(self, error: EngineError) -> None:
        """End every waiting and running sequence with `error`."""
        for sequence in self.sequences:
            self._scheduler.finish(sequence, SequenceStatus.FINISHED_ABORTED)
            sequence.sink.put(EngineOutput(sequence.request.index, error=error))

    def close(self) -> None:
        """Close the remote prefill, if any."""
        if self._prefill is not None:
            self._prefill.remote.close()

    def _step_seqs_cap(self) -> int | None:
        """With several steps in flight, each takes its share of the sequences, so that
        the steps after it find some to run; None (no cap) with one."""
        depth = self._runner.steps_in_flight
        if depth == 1:
            return None
        scheduler = self._scheduler
        # Waiting sequences count only as far as free slots could admit them.
        runnable = min(
            len(scheduler.running) + len(scheduler.waiting),
            self.config.scheduler.max_num_seqs,
        )
        return max(1, -(-runnable // depth))

    def _launch(self, plan: SchedulerOutput) -> None:
        """Build the step and start it; sample it at once (lazily) when the runner returns
        its logits at once. An MLX or model error fails this step's requests, not the
        engine, once the steps before it are read (their tokens come out as they would
        synchronously)."""
        try:
            proposals = self._propose(plan)
            rows = make_rows(plan, proposals, self._kv)
        except InvariantError:
            raise
        except Exception as error:
            self._collect_sampled()
            self._fail_steps([plan], error)
            return
        try:
            self._runner.start(rows)
        except Exception as error:
            self._collect_sampled()
            self._fail_steps([plan, *self._steps_the_runner_dropped()], error)
            return
        started = StartedStep(plan, proposals, samples_per_row(plan))
        if self._runner.steps_in_flight == 1:
            try:
                started.draws = make_draws(started, self._runner.finish(), self._acceptance_rule)
            except InvariantError:
                raise
            except Exception as error:
                self._collect_sampled()
                self._fail_steps([plan], error)
                return
        self._scheduler.begin_step(plan)
        for item in plan.scheduled:
            item.sequence.steps_in_flight += 1
        self._in_flight.append(started)
        if started.draws is None:
            return
        if not self._hands_over_after_reading and not self._hand_over(started):
            return
        if self._runs_ahead:
            hold_pending(started.draws)
            for item, samples in zip(plan.scheduled, started.samples, strict=True):
                sequence = item.sequence
                sequence.runs_ahead = can_run_ahead(sequence, samples)
                started.blocks_next |= samples and needs_host_tokens(sequence)

    def _hand_over(self, started: StartedStep) -> bool:
        """Start evaluating a sampled step: its draws and the pools' writes. On an error
        the step is failed, after the steps before it are read; returns whether it went."""
        started.handed_over = True
        try:
            mx.async_eval(
                _draw_arrays(started.draws or ()),
                [a for storage in self._storages for a in storage.arrays()],
            )
        except Exception as error:
            self._in_flight.remove(started)
            for item in started.plan.scheduled:
                item.sequence.steps_in_flight -= 1
            self._collect_sampled()
            self._fail_steps([started.plan], error)
            return False
        return True

    def _collect_oldest(self) -> None:
        """Read the oldest step in flight, then update its sequences and emit its tokens;
        a sequence that ended since the step began has its tokens discarded."""
        oldest = self._in_flight[0]
        if oldest.draws is not None and not oldest.handed_over and not self._hand_over(oldest):
            return
        started = self._in_flight.popleft()
        plan = started.plan
        for item in plan.scheduled:
            item.sequence.steps_in_flight -= 1
        draws = started.draws
        arrays = []
        if draws is None:
            try:
                logits = self._runner.finish()
            except Exception as error:
                self._fail_steps([plan, *self._steps_the_runner_dropped()], error)
                return
        try:
            if draws is None:
                draws = make_draws(started, logits, self._acceptance_rule)
                arrays = [a for storage in self._storages for a in storage.arrays()]
            mx.eval(_draw_arrays(draws), arrays)
            emitted = [row for draw in draws for row in draw.emitted()]
        except InvariantError:
            raise
        except Exception as error:
            self._fail_steps([plan], error)
            return
        self._consecutive_failures = 0
        live, num_accepted = append_tokens(emitted)
        for row in live:
            self._num_draft_tokens += row.num_drafts
            self._num_accepted_draft_tokens += num_accepted[row.sequence.seq_id]
        self._scheduler.complete_step(plan, num_accepted)
        for row in live:
            for token_id, logprobs in row.tokens:
                emit_token(self._scheduler, row.sequence, token_id, logprobs)
                if row.sequence.status.finished:
                    break

    def _collect_sampled(self) -> None:
        """Read the steps in flight that were sampled at launch, oldest first."""
        while self._in_flight and self._in_flight[0].draws is not None:
            self._collect_oldest()

    @property
    def _acceptance_rule(self) -> AcceptanceRule:
        if self._speculation is None:
            return AcceptanceRule.EXACT
        return self._speculation.config.acceptance

    def _steps_the_runner_dropped(self) -> list[SchedulerOutput]:
        """After a runner error: the plans of the steps in flight the runner no longer
        holds (it drops the oldest first), taken off the engine's list too."""
        dropped = []
        awaiting = [started for started in self._in_flight if started.draws is None]
        while len(awaiting) > self._runner.num_started:
            started = awaiting.pop(0)
            self._in_flight.remove(started)
            for item in started.plan.scheduled:
                item.sequence.steps_in_flight -= 1
            dropped.append(started.plan)
        return dropped

    def _propose(self, plan: SchedulerOutput) -> tuple[DraftProposal, ...]:
        """Prepare the KV storage for the step and draft its sequences' tokens."""
        kv = self._kv
        copies = kv.take_block_copies()
        self._runner.prepare_storage(kv.materialized_blocks, copies)
        for storage in self._storages[1:]:  # the draft model's
            for group, num_blocks in enumerate(kv.materialized_blocks):
                storage.ensure_capacity(num_blocks, group)
            storage.copy_blocks(copies)
        if self._speculation is None:
            return tuple(DraftProposal((), None, 0) for _ in plan.scheduled)
        return tuple(self._speculation.propose(plan.scheduled, kv))

    def _fail_steps(self, plans: Seq[SchedulerOutput], error: Exception) -> None:
        """End the requests of steps that failed together (one failure in a row); after
        `max_consecutive_failures` in a row, set `failure`: the engine must stop."""
        logger.error("an engine step failed; ending its requests", exc_info=error)
        for item in (item for plan in plans for item in plan.scheduled):
            sequence = item.sequence
            if not sequence.status.finished:
                self._scheduler.finish(sequence, SequenceStatus.FINISHED_ABORTED)
                sequence.sink.put(EngineOutput(sequence.request.index, error=error))
        self._consecutive_failures += 1
        if self._consecutive_failures >= self.config.max_consecutive_failures:
            logger.critical(
                "%d engine steps failed in a row; the engine stops", self._consecutive_failures
            )
            self.failure = error


def _draw_arrays(draws: Seq[Draw | BatchDraw]) -> list[mx.array]:
    return [a for draw in draws for a in draw.arrays()]
