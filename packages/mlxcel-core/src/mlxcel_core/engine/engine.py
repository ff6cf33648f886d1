"""The continuous-batching engine: one inference thread stepping every request together.

Each step: schedule (which sequences compute how many tokens) → draft (with speculative
decoding) → one batched forward pass over the paged KV cache → sample each finished row
with its own sampler, verifying its drafts (rows whose chains need no per-row work draw
together) → update and emit. Requests join and leave
between steps; chunked prefill shares steps with decode.

A runner that keeps several steps in flight (`ModelRunner.steps_in_flight`: pipeline
stages, each working on a different step) gets the next step started before the oldest is
sampled; each step then holds sequences the steps in flight do not, so the running
sequences take turns, as in vLLM's pipeline-parallel virtual engines.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, replace

import mlx.core as mx

from mlxcel_core.adapters import RowAdapterScales
from mlxcel_core.cache.layout import model_cache_layout
from mlxcel_core.cache.paged import InvariantError, KeyedSpan, PagedKVStorage
from mlxcel_core.engine.config import (
    EngineConfig,
    check_cache_layout,
    prefill_chunk_for,
    profile_largest_step,
)
from mlxcel_core.engine.kv_plan import make_kv_manager, make_planned_storage, plan_kv_cache
from mlxcel_core.engine.remote_prefill import (
    PrefilledKV,
    PrefillJob,
    RemotePrefill,
    RemotePrefillFactory,
    returned_block_ids,
)
from mlxcel_core.engine.request import (
    EngineClosedError,
    EngineError,
    EngineOutput,
    EngineOverloadedError,
    EngineRequest,
    ImagesNotSupportedError,
    OutputSink,
    RequestCancelledError,
    RequestHandle,
)
from mlxcel_core.engine.row_sampling import (
    BatchDraw,
    Draw,
    can_draw_together,
    draw_together,
    draw_tokens,
)
from mlxcel_core.engine.runner import ModelRunner, RowInput, StepLogits
from mlxcel_core.engine.scheduler import Scheduler, SchedulerOutput
from mlxcel_core.engine.sequence import FINISHED_STATUS, Sequence, SequenceStatus
from mlxcel_core.engine.speculation import Speculation, make_speculation
from mlxcel_core.engine.stats import EngineStats, make_engine_stats
from mlxcel_core.generate import GenerationStats, LanguageModel, TextAssembler
from mlxcel_core.images import ImageLanguageModel
from mlxcel_core.logprobs import TokenLogprobs
from mlxcel_core.sampling import Sampler
from mlxcel_core.speculative import (
    AcceptanceRule,
    DraftProposal,
    SpeculativeMethod,
)
from mlxcel_core.threads import thread_stream

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Submission:
    seq_id: int
    request: EngineRequest
    sink: OutputSink
    handle: RequestHandle


@dataclass(frozen=True)
class _StartedStep:
    """A step the runner has begun and the engine has not sampled yet."""

    plan: SchedulerOutput
    proposals: tuple[DraftProposal, ...]


# A group's prompt as forking sees it: handle id, prompt ids, adapter-scales salt, images.
_GroupPrompt = tuple[int, tuple[int, ...], tuple[str, ...], tuple[KeyedSpan, ...]]


# Builds the engine's model runner from the model, its KV storage and unfused adapters.
RunnerFactory = Callable[[LanguageModel, PagedKVStorage, RowAdapterScales | None], ModelRunner]


def _make_model_runner(
    model: LanguageModel, storage: PagedKVStorage, adapters: RowAdapterScales | None
) -> ModelRunner:
    return ModelRunner(model, storage, adapters=adapters)


def _images_refusal(
    model: LanguageModel,
    make_runner: RunnerFactory | None,
    make_remote_prefill: RemotePrefillFactory | None,
) -> str | None:
    """Why this engine cannot take requests with images, or None when it can."""
    if not isinstance(model, ImageLanguageModel) or not model.supports_images:
        return "the model has no vision support: it cannot take images"
    if make_runner is not None:
        return (
            "images are not supported when the model runs across ranks (tensor or pipeline "
            "parallelism): the steps sent to the other ranks carry token ids only"
        )
    if make_remote_prefill is not None:
        return (
            "images are not supported with disaggregated prefill: the prompts sent to the "
            "prefill rank carry token ids only"
        )
    return None


def _log_fatal(error: BaseException) -> None:
    logger.critical("the engine stopped: %s", error, exc_info=error)


class Engine:
    """Runs generation requests together on one dedicated thread.

    All MLX work happens on that thread, in an MLX stream of its own; callers only submit,
    read their sink and cancel. Construction profiles the model and sizes the KV cache
    before returning.

    Args:
        model: the language model; its weights must already be evaluated.
        config: limits and cache settings.
        draft_model: the draft model when `config.speculative` asks for one; it must share
            the target's vocabulary, and its weights must be evaluated.
        on_fatal: called on the engine thread when an internal invariant breaks or the
            step loop itself fails (after the engine has ended every request); the server
            exits the process there. None logs the error.
        adapters: the model's unfused LoRA adapters, or None: each request's scales are
            resolved on arrival and set per row before every forward pass (the draft model
            runs without them).
        make_runner: builds the model runner once the KV storage exists (after the profile
            pass); tensor parallelism wraps the runner here to replay each step on other
            ranks. None builds a plain `ModelRunner`.
        make_remote_prefill: builds, once the KV storage exists, where new prompts are
            prefilled instead of in this engine (disaggregated prefill; see
            `mlxcel_core.engine.remote_prefill`); it is closed when the engine stops.
            None prefills here.

    Requests with images need an `ImageLanguageModel` with `supports_images`, run in this
    process: neither `make_runner` nor `make_remote_prefill` carries images to other ranks.
    The draft model stays text-only; the model verifies its drafts with the images.

    A model whose layers keep a recurrent state (`CacheLayout.has_state`) runs with one
    state slot per running sequence beside the KV pool, without prefix caching (a state
    summarizes its whole prefix in one slot, which no block can share), speculative
    decoding or disaggregated prefill. A model's sliding-window layers keep their blocks in
    a block group of their own, which frees each sequence's blocks behind the window
    (`mlxcel_core.cache.block_groups`); with disaggregated prefill every layer shares one.

    Raises:
        InsufficientMemoryError: the KV budget cannot hold one sequence of `context_size`.
        ValueError: the model stores no keys and values; a draft model is missing, given
            without being asked for, or has another vocabulary size; speculative decoding
            or disaggregated prefill is asked of a model with recurrent state layers.
    """

    def __init__(
        self,
        model: LanguageModel,
        config: EngineConfig | None = None,
        *,
        draft_model: LanguageModel | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
        adapters: RowAdapterScales | None = None,
        make_runner: RunnerFactory | None = None,
        make_remote_prefill: RemotePrefillFactory | None = None,
    ) -> None:
        self._model = model
        self._make_remote_prefill = make_remote_prefill
        self._adapters = adapters
        self._make_runner = _make_model_runner if make_runner is None else make_runner
        self._images_refusal = _images_refusal(model, make_runner, make_remote_prefill)
        self._config = EngineConfig() if config is None else config
        self._layout = model_cache_layout(model)
        check_cache_layout(
            self._layout, self._config, remote_prefill=make_remote_prefill is not None
        )
        wants_draft = (
            self._config.speculative is not None
            and self._config.speculative.method is SpeculativeMethod.DRAFT_MODEL
        )
        if wants_draft != (draft_model is not None):
            raise ValueError(
                "draft_model must be given exactly when config.speculative uses a draft model"
            )
        self._draft_model = draft_model
        self._on_fatal = _log_fatal if on_fatal is None else on_fatal
        self._condition = threading.Condition()
        self._inbox: list[_Submission] = []
        self._prefilled: list[PrefilledKV] = []
        # Sequences whose prompt KV is in flight and the jobs sent for them, by seq_id.
        self._in_flight: dict[int, tuple[Sequence, PrefillJob]] = {}
        # False while every unfinished sequence waits on KV in flight: nothing to step.
        self._can_step = True
        # Sequences the engine thread holds as waiting; updated under the lock when arrivals
        # are taken, so no submission sees a moment where a waiting sequence is uncounted.
        self._num_held_waiting = 0
        self._closing = False
        self._failure: BaseException | None = None
        # The error `abandon` ended the requests with, which the engine thread ends any it
        # still holds with too.
        self._abandoned_with: EngineError | None = None
        self._seq_ids = itertools.count()
        self._handle_ids = itertools.count()
        self._stats = EngineStats()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="mlxcel-engine", daemon=True)
        self._thread.start()
        try:
            self._started.wait()
        except KeyboardInterrupt:
            # The caller never gets this engine to shut it down.
            self.shutdown_through_interrupts()
            raise
        if self._start_error is not None:
            self._thread.join()
            raise self._start_error

    @property
    def config(self) -> EngineConfig:
        return self._config

    @property
    def stats(self) -> EngineStats:
        """The state after the latest step."""
        return self._stats

    @property
    def num_waiting(self) -> int:
        """Sequences submitted and not running: the latest step's waiting ones plus every
        arrival since, counted as waiting until the step that admits it ends."""
        with self._condition:
            return len(self._inbox) + self._num_held_waiting

    @property
    def num_running(self) -> int:
        """Sequences running after the latest step."""
        return self._stats.num_running

    @property
    def failure(self) -> BaseException | None:
        """Why the engine stopped by itself (repeated step failures), or None while healthy."""
        return self._failure

    def submit(self, requests: Seq[EngineRequest], sink: OutputSink) -> RequestHandle:
        """Queue a group of requests (e.g. the `n` choices of one API call), all or none.

        Each request's outputs go to `sink` in order, tagged with its `index`, ending with
        one terminal output.

        Raises:
            ImagesNotSupportedError: a request holds images this engine cannot run (see
                the class); the message says why.
            ValueError: `requests` is empty or larger than the waiting queue's bound.
            EngineOverloadedError: the waiting queue has no room for the whole group now.
            EngineClosedError: the engine is shutting down or has failed.
        """
        if not requests:
            raise ValueError("requests must hold at least one request")
        if self._images_refusal is not None and any(request.images for request in requests):
            raise ImagesNotSupportedError(self._images_refusal)
        if len(requests) > self._config.max_waiting:
            raise ValueError(
                f"a group of {len(requests)} sequences is larger than the waiting queue's "
                f"bound ({self._config.max_waiting})"
            )
        handle = RequestHandle(next(self._handle_ids))
        with self._condition:
            if self._closing:
                raise EngineClosedError("the engine is shutting down")
            # Sequences that free running slots will take at once do not wait in the queue.
            free_slots = max(0, self._config.scheduler.max_num_seqs - self._stats.num_running)
            waiting = len(self._inbox) + self._num_held_waiting - free_slots
            if waiting + len(requests) > self._config.max_waiting:
                raise EngineOverloadedError(
                    f"the server is busy: {max(0, waiting)} requests are waiting "
                    f"(limit {self._config.max_waiting}); retry later",
                    retry_after_seconds=self._config.retry_after_seconds,
                )
            self._inbox.extend(
                _Submission(next(self._seq_ids), request, sink, handle) for request in requests
            )
            self._condition.notify()
        return handle

    def shutdown(self, timeout: float | None = None) -> None:
        """Refuse new requests, end waiting and running ones, and join the thread.

        Every unfinished request ends with an `EngineClosedError` output within one step.
        Safe to call more than once.

        Raises:
            TimeoutError: the thread did not end within `timeout` seconds.
        """
        with self._condition:
            self._closing = True
            self._condition.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the engine thread did not stop within {timeout} s")

    def shutdown_through_interrupts(self) -> bool:
        """`shutdown`, waiting for the thread again after each Ctrl-C that interrupts it:
        an engine thread still inside MLX when the interpreter exits aborts the process.

        Returns:
            Whether a Ctrl-C came while waiting; the caller raises it again when done.
        """
        interrupted = False
        while True:
            try:
                self.shutdown()
                return interrupted
            except KeyboardInterrupt:
                interrupted = True

    def abandon(self, error: EngineError) -> None:
        """End every unfinished request with `error` now, from the calling thread, and
        refuse new ones, without waiting for the engine thread.

        For an engine thread that may be blocked for good inside a step (a collective whose
        peer hangs or died: MLX cannot interrupt it). `shutdown` must not be called after
        this; the thread is a daemon and is left behind. Should the thread resume, its later
        outputs follow each request's terminal error, and sinks ignore them; an idle thread
        ends at once, ending the requests it still holds with `error` as well (it may reach
        one before this call does).
        """
        with self._condition:
            self._closing = True
            self._condition.notify_all()
            self._failure = error
            self._abandoned_with = error
            arrivals = list(self._inbox)
            scheduler = self._scheduler
            sequences = [*scheduler.waiting, *scheduler.running]
        for submission in arrivals:
            submission.sink.put(EngineOutput(submission.request.index, error=error))
        for sequence in sequences:
            if not sequence.status.finished:
                sequence.sink.put(EngineOutput(sequence.request.index, error=error))

    # The engine thread from here on.

    def _run(self) -> None:
        with thread_stream():
            try:
                self._setup()
            except Exception as error:
                self._start_error = error
                self._started.set()
                return
            self._started.set()
            try:
                self._loop()
            # Step failures are handled inside the loop; anything reaching here (a broken
            # invariant, a bug in the bookkeeping) leaves an engine that cannot go on.
            except Exception as error:
                self._failure = error
                self._close_all(EngineClosedError("the engine stopped on an internal error"))
                self._on_fatal(error)
            finally:
                self._drain_steps_in_flight()
                with self._condition:
                    abandoned_with = self._abandoned_with
                self._close_all(abandoned_with or EngineClosedError("the server is shutting down"))
                if self._remote_prefill is not None:
                    self._remote_prefill.close()

    def _setup(self) -> None:
        config = self._config
        profile = profile_largest_step(config, self._model, self._layout)
        draft_profile = draft_cache = None
        if self._draft_model is not None:
            draft_layout = model_cache_layout(self._draft_model)
            draft_profile = profile_largest_step(config, self._draft_model, draft_layout)
            draft_cache = (draft_profile, draft_layout)
            if draft_profile.vocab_size != profile.vocab_size:
                raise ValueError(
                    f"the draft model's vocabulary ({draft_profile.vocab_size} tokens) is not "
                    f"the model's ({profile.vocab_size}); a draft model must share it"
                )
        if config.enable_prefix_caching and not self._layout.supports_prefix_caching:
            logger.info(
                "prefix caching is off: the model's recurrent layers keep a state per "
                "sequence that no cached block can share"
            )
        chunk = prefill_chunk_for(config, profile)
        if chunk != config.scheduler.max_prefill_chunk:
            config = replace(config, scheduler=replace(config.scheduler, max_prefill_chunk=chunk))
            self._config = config
        # Disaggregated prefill hands over one block table per sequence.
        plan = plan_kv_cache(
            config,
            profile,
            self._layout,
            draft_cache,
            separate_windows=self._make_remote_prefill is None,
        )
        self._kv = make_kv_manager(
            plan,
            config.block_size,
            prefix_caching=config.enable_prefix_caching and self._layout.supports_prefix_caching,
        )
        self._storage = make_planned_storage(config, profile, plan)
        self._storages = [self._storage]
        self._speculation: Speculation | None = None
        if config.speculative is not None:
            draft = None
            if self._draft_model is not None and draft_profile is not None:
                draft = (self._draft_model, draft_profile)
            self._speculation, draft_storage = make_speculation(
                config.speculative, draft, block_size=config.block_size, plan=plan
            )
            if draft_storage is not None:
                self._storages.append(draft_storage)
        self._scheduler = Scheduler(
            config.scheduler,
            self._kv,
            num_lookahead_tokens=(
                0 if config.speculative is None else config.speculative.num_draft_tokens
            ),
            remote_prefill=self._make_remote_prefill is not None,
            recurrent_state=self._layout.has_state,
        )
        self._runner = self._make_runner(self._model, self._storage, self._adapters)
        self._remote_prefill: RemotePrefill | None = None
        if self._make_remote_prefill is not None:
            self._remote_prefill = self._make_remote_prefill(self._storage, self._deliver)
        self._steps_in_flight: deque[_StartedStep] = deque()
        self._consecutive_failures = 0
        self._num_draft_tokens = 0
        self._num_accepted_draft_tokens = 0
        self._publish_stats()

    def _loop(self) -> None:
        while True:
            with self._condition:
                while not (
                    self._inbox
                    or self._prefilled
                    or (self._can_step and self._has_work)
                    or self._closing
                ):
                    self._condition.wait()
                closing = self._closing
                if not closing:
                    arrivals, self._inbox = self._inbox, []
                    prefilled, self._prefilled = self._prefilled, []
                    self._num_held_waiting += len(arrivals)
            if closing:
                return
            self._can_step = True
            for kv in prefilled:
                self._adopt_prefilled(kv)
            # A group arrives whole, so each prompt's first choice is among the same arrivals.
            firsts: dict[_GroupPrompt, Sequence] = {}
            for submission in arrivals:
                self._admit(submission, firsts)
            self._end_cancelled()
            if self._has_work:
                self._step()
            self._publish_stats()

    @property
    def _has_work(self) -> bool:
        return self._scheduler.has_work or bool(self._steps_in_flight)

    def _admit(self, submission: _Submission, firsts: dict[_GroupPrompt, Sequence]) -> None:
        """Queue a new sequence; a later choice of a prompt forks from its first choice
        (of the same adapter scales, whose KV it can share)."""
        request = submission.request
        try:
            if request.generation.context_size > self._config.context_size:
                raise ValueError(
                    f"the request's context size ({request.generation.context_size} tokens) "
                    f"exceeds the engine's ({self._config.context_size})"
                )
            text = TextAssembler(request.detokenizer, request.generation, len(request.prompt_ids))
            sampler = Sampler(request.sampling, dry_breaker_ids=request.dry_breaker_ids)
        except ValueError as error:
            submission.sink.put(EngineOutput(request.index, error=error))
            return
        sequence = Sequence(
            submission.seq_id, request, submission.sink, submission.handle, sampler, text
        )
        if self._adapters is not None:
            sequence.adapter_scales = self._adapters.resolve_scales(request.adapter_scales)
        if text.finish_reason is not None:
            # Nothing to generate (a zero token budget): it ends without ever being queued.
            sequence.status = FINISHED_STATUS[text.finish_reason]
            self._emit_final(sequence, text.finish())
            return
        group_prompt = (
            submission.handle.request_id,
            request.prompt_ids,
            sequence.cache_salt,
            sequence.cache_spans,
        )
        if len(request.prompt_ids) > 1:
            sequence.fork_parent = firsts.get(group_prompt)
            firsts.setdefault(group_prompt, sequence)
        self._scheduler.add(sequence)

    def _end_cancelled(self) -> None:
        for sequence in [*self._scheduler.waiting, *self._scheduler.running]:
            # One in a step in flight ends once that step is sampled: its KV is being written.
            if sequence.handle.cancelled and not sequence.in_step:
                self._scheduler.finish(sequence, SequenceStatus.FINISHED_ABORTED)
                error = RequestCancelledError("the request was cancelled")
                sequence.sink.put(EngineOutput(sequence.request.index, error=error))

    def _deliver(self, kv: PrefilledKV) -> None:
        """Called from the remote prefill's thread: hand arrived KV to the engine thread."""
        with self._condition:
            self._prefilled.append(kv)
            self._condition.notify()

    def _adopt_prefilled(self, kv: PrefilledKV) -> None:
        """Write arrived prompt KV into the sequence's blocks, unless the sequence ended or
        was preempted since its job was sent."""
        sequence, job = self._in_flight.get(kv.seq_id, (None, None))
        if sequence is None or job is None or job.attempt != kv.attempt:
            return
        del self._in_flight[kv.seq_id]
        if sequence.status is not SequenceStatus.RUNNING or not sequence.kv_in_flight:
            return  # it ended, or was preempted and waits to be sent again
        block_ids = returned_block_ids(self._kv.block_table(sequence.seq_id), job)
        self._storage.ensure_capacity(self._kv.materialized_blocks[0])
        self._storage.write_blocks(block_ids, kv.contents)
        self._scheduler.complete_remote_prefill(sequence)

    def _send_to_remote(self, remote: RemotePrefill, sequences: Seq[Sequence]) -> None:
        size = self._storage.block_size
        for sequence in sequences:
            num_prompt = sequence.num_tokens - 1
            first_block = sequence.num_computed // size
            job = PrefillJob(
                sequence.seq_id,
                sequence.num_preemptions,
                tuple(sequence.token_ids[:num_prompt]),
                first_block,
                -(-num_prompt // size) - first_block,
            )
            self._in_flight[sequence.seq_id] = (sequence, job)
            remote.submit(job)

    def _step(self) -> None:
        """Start the next step, then sample the oldest step in flight once the runner
        holds as many as it can, or once no sequence is left to start one with."""
        plan = self._scheduler.schedule(self._step_seqs_cap())
        if plan.remote and self._remote_prefill is not None:
            self._send_to_remote(self._remote_prefill, plan.remote)
        if plan.scheduled:
            self._start(plan)
        elif not self._steps_in_flight:
            if plan.remote or self._scheduler.num_in_flight:
                self._can_step = False
                return
            raise InvariantError(
                f"no sequence could be scheduled with {len(self._scheduler.waiting)} waiting "
                f"and {len(self._scheduler.running)} running"
            )
        if self._steps_in_flight and (
            not plan.scheduled or len(self._steps_in_flight) >= self._runner.steps_in_flight
        ):
            self._finish_oldest()

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
            self._config.scheduler.max_num_seqs,
        )
        return max(1, -(-runnable // depth))

    def _start(self, plan: SchedulerOutput) -> None:
        # An MLX or model error fails this step's requests, not the engine.
        try:
            proposals = self._propose(plan)
            rows = self._rows(plan, proposals)
        except InvariantError:
            raise
        except Exception as error:
            self._fail_steps([plan], error)
            return
        try:
            self._runner.start(rows)
        except Exception as error:
            self._fail_steps([plan, *self._steps_the_runner_dropped()], error)
            return
        for item in plan.scheduled:
            item.sequence.in_step = True
        self._steps_in_flight.append(_StartedStep(plan, proposals))

    def _finish_oldest(self) -> None:
        started = self._steps_in_flight.popleft()
        plan = started.plan
        for item in plan.scheduled:
            item.sequence.in_step = False
        try:
            logits = self._runner.finish()
        except Exception as error:
            self._fail_steps([plan, *self._steps_the_runner_dropped()], error)
            return
        try:
            draws = self._draw(started, logits)
            mx.eval(
                [a for draw in draws for a in draw.arrays()],
                [a for storage in self._storages for a in storage.arrays()],
            )
            emitted = [row for draw in draws for row in draw.emitted()]
        except InvariantError:
            raise
        except Exception as error:
            self._fail_steps([plan], error)
            return
        self._consecutive_failures = 0
        num_accepted = {}
        for row in emitted:
            sequence = row.sequence
            sequence.token_ids.extend(token for token, _ in row.tokens)
            accepted = len(row.tokens) - 1
            num_accepted[sequence.seq_id] = accepted
            sequence.num_draft_tokens += row.num_drafts
            sequence.num_accepted_draft_tokens += accepted
            self._num_draft_tokens += row.num_drafts
            self._num_accepted_draft_tokens += accepted
        self._scheduler.complete_step(plan, num_accepted)
        for row in emitted:
            for token_id, logprobs in row.tokens:
                self._take_token(row.sequence, token_id, logprobs)
                if row.sequence.status.finished:
                    break

    def _steps_the_runner_dropped(self) -> list[SchedulerOutput]:
        """After a runner error: the plans of the steps in flight the runner no longer
        holds (it drops the oldest first), taken off the engine's list too."""
        dropped = []
        while len(self._steps_in_flight) > self._runner.num_started:
            dropped.append(self._steps_in_flight.popleft().plan)
        return dropped

    def _drain_steps_in_flight(self) -> None:
        """Take the logits of the steps still in flight, unsampled, so that no rank is left
        sending them when the engine stops."""
        while self._runner.num_started:
            try:
                self._runner.finish()
            except Exception as error:
                logger.warning("a step in flight failed while the engine stopped: %s", error)
        self._steps_in_flight.clear()

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

    def _rows(self, plan: SchedulerOutput, proposals: Seq[DraftProposal]) -> list[RowInput]:
        kv = self._kv
        rows = []
        for item, proposal in zip(plan.scheduled, proposals, strict=True):
            sequence = item.sequence
            start = sequence.num_computed
            tokens = [*sequence.token_ids[start : start + item.num_new_tokens], *proposal.token_ids]
            num_logits = len(tokens) if proposal.token_ids else 1
            rows.append(
                RowInput(
                    tokens,
                    kv.block_tables(sequence.seq_id),
                    start,
                    num_logits,
                    sequence.adapter_scales,
                    sequence.request.images,
                    state_slot=sequence.slot,
                    state_source=item.state_source,
                )
            )
        return rows

    def _draw(self, started: _StartedStep, logits: StepLogits) -> list[Draw | BatchDraw]:
        plan = started.plan
        draws: list[Draw | BatchDraw] = []
        together: dict[Hashable, list[int]] = {}
        rule = (
            AcceptanceRule.EXACT
            if self._speculation is None
            else self._speculation.config.acceptance
        )
        for i, (item, proposal) in enumerate(zip(plan.scheduled, started.proposals, strict=True)):
            sequence = item.sequence
            if sequence.num_computed + item.num_new_tokens < sequence.num_tokens:
                continue  # a prefill chunk that does not reach the prompt's end yet
            if can_draw_together(sequence, proposal.token_ids):
                together.setdefault(sequence.sampler.batch_group, []).append(i)
                continue
            row_logits = logits.row(i)
            draws.append(
                draw_tokens(sequence, row_logits, proposal.token_ids, proposal.probs, rule)
            )
        for members in together.values():
            sequences = [plan.scheduled[i].sequence for i in members]
            draws.append(draw_together(sequences, logits.last(members)))
        return draws

    def _take_token(
        self, sequence: Sequence, token_id: int, logprobs: TokenLogprobs | None
    ) -> None:
        """Emit a token already appended to the sequence's tokens; end it if it stops."""
        now = time.perf_counter()
        if sequence.first_token_time is None:
            sequence.first_token_time = now
        sequence.last_token_time = now
        if sequence.request.constraint is not None:
            sequence.request.constraint.advance(token_id)
        text = sequence.text.add(token_id)
        if token_id not in sequence.request.generation.stop_token_ids:
            sequence.sink.put(
                EngineOutput(
                    sequence.request.index,
                    text,
                    token_id,
                    seed=sequence.sampler.seed,
                    logprobs=logprobs,
                )
            )
        reason = sequence.text.finish_reason
        if reason is not None:
            self._scheduler.finish(sequence, FINISHED_STATUS[reason])
            self._emit_final(sequence, sequence.text.finish())

    def _emit_final(self, sequence: Sequence, final_text: str) -> None:
        """Send a finished sequence's last text, its finish reason and its statistics."""
        start = sequence.first_scheduled_time or sequence.arrival_time
        first = sequence.first_token_time or start
        stats = GenerationStats(
            prompt_tokens=sequence.num_prompt_tokens,
            prompt_seconds=first - start,
            generated_tokens=sequence.text.num_generated,
            decode_seconds=(sequence.last_token_time or first) - first,
            peak_memory_bytes=mx.get_peak_memory(),
            cached_tokens=sequence.num_cached_tokens,
            draft_tokens=sequence.num_draft_tokens,
            accepted_draft_tokens=sequence.num_accepted_draft_tokens,
        )
        sequence.sink.put(
            EngineOutput(
                sequence.request.index,
                final_text,
                None,
                sequence.text.finish_reason,
                stats,
                sequence.sampler.seed,
            )
        )

    def _fail_steps(self, plans: Seq[SchedulerOutput], error: Exception) -> None:
        """End the requests of steps that failed together (one failure in a row)."""
        logger.error("an engine step failed; ending its requests", exc_info=error)
        for item in (item for plan in plans for item in plan.scheduled):
            sequence = item.sequence
            sequence.in_step = False
            if not sequence.status.finished:
                self._scheduler.finish(sequence, SequenceStatus.FINISHED_ABORTED)
                sequence.sink.put(EngineOutput(sequence.request.index, error=error))
        self._consecutive_failures += 1
        if self._consecutive_failures >= self._config.max_consecutive_failures:
            logger.critical(
                "%d engine steps failed in a row; the engine stops", self._consecutive_failures
            )
            with self._condition:
                self._closing = True
                self._failure = error

    def _close_all(self, error: EngineError) -> None:
        with self._condition:
            self._closing = True
            arrivals, self._inbox = self._inbox, []
        for submission in arrivals:
            submission.sink.put(EngineOutput(submission.request.index, error=error))
        scheduler = self._scheduler
        for sequence in [*scheduler.waiting, *scheduler.running]:
            scheduler.finish(sequence, SequenceStatus.FINISHED_ABORTED)
            sequence.sink.put(EngineOutput(sequence.request.index, error=error))
        self._publish_stats()

    def _publish_stats(self) -> None:
        stats = make_engine_stats(
            self._scheduler,
            self._kv,
            self._storage,
            num_draft_tokens=self._num_draft_tokens,
            num_accepted_draft_tokens=self._num_accepted_draft_tokens,
        )
        with self._condition:
            self._stats = stats
            self._num_held_waiting = stats.num_waiting
