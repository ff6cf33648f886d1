"""The continuous-batching engine: one inference thread stepping every request together.

`Engine` is the thread shell: callers submit groups of requests, read their sinks and
cancel; the engine thread takes arrivals from an inbox between steps and steps an
`EngineCore` (`mlxcel_core.engine.core`), which does all the scheduling, MLX work and
emission without threads or locks.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from collections.abc import Sequence as Seq

from mlxcel_core.adapters import RowAdapterScales
from mlxcel_core.engine.config import EngineConfig
from mlxcel_core.engine.core import EngineCore, GroupPrompt, RunnerFactory, Submission
from mlxcel_core.engine.remote_prefill import PrefilledKV, RemotePrefillFactory
from mlxcel_core.engine.request import (
    EngineClosedError,
    EngineError,
    EngineOutput,
    EngineOverloadedError,
    EngineRequest,
    ImagesNotSupportedError,
    OutputSink,
    RequestHandle,
)
from mlxcel_core.engine.sequence import Sequence
from mlxcel_core.engine.stats import EngineStats
from mlxcel_core.images import ImageLanguageModel
from mlxcel_core.language_model import LanguageModel
from mlxcel_core.speculative import SpeculativeMethod
from mlxcel_core.threads import thread_stream

logger = logging.getLogger(__name__)


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
        self._make_runner = make_runner
        self._images_refusal = _images_refusal(model, make_runner, make_remote_prefill)
        self._config = EngineConfig() if config is None else config
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
        self._inbox: list[Submission] = []
        self._prefilled: list[PrefilledKV] = []
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
        """The settings the engine runs with: those given, with the prefill chunk lowered
        to what `max_prefill_seconds` allows at the speed measured at start."""
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
                Submission(next(self._seq_ids), request, sink, handle) for request in requests
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
            sequences = self._core.sequences
        for submission in arrivals:
            submission.sink.put(EngineOutput(submission.request.index, error=error))
        for sequence in sequences:
            if not sequence.status.finished:
                sequence.sink.put(EngineOutput(sequence.request.index, error=error))

    # The engine thread from here on.

    def _run(self) -> None:
        with thread_stream():
            try:
                self._core = EngineCore(
                    self._model,
                    self._config,
                    draft_model=self._draft_model,
                    adapters=self._adapters,
                    make_runner=self._make_runner,
                    make_remote_prefill=self._make_remote_prefill,
                    deliver=self._deliver,
                )
            except Exception as error:
                self._start_error = error
                self._started.set()
                return
            self._config = self._core.config  # its prefill chunk may have been lowered
            self._publish_stats()
            self._started.set()
            core = self._core
            try:
                self._loop(core)
            # Step failures are handled inside the core; anything reaching here (a broken
            # invariant, a bug in the bookkeeping) leaves an engine that cannot go on.
            except Exception as error:
                self._failure = error
                self._close_all(core, EngineClosedError("the engine stopped on an internal error"))
                self._on_fatal(error)
            finally:
                core.drain()
                with self._condition:
                    abandoned_with = self._abandoned_with
                self._close_all(
                    core, abandoned_with or EngineClosedError("the server is shutting down")
                )
                core.close()

    def _loop(self, core: EngineCore) -> None:
        while True:
            with self._condition:
                while not (
                    self._inbox
                    or self._prefilled
                    or (core.can_step and core.has_work)
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
            core.can_step = True
            for kv in prefilled:
                core.adopt_prefilled(kv)
            # A group arrives whole, so each prompt's first choice is among the same arrivals.
            firsts: dict[GroupPrompt, Sequence] = {}
            for submission in arrivals:
                core.admit(submission, firsts)
            core.end_cancelled()
            if core.has_work:
                core.step()
            if core.failure is not None:
                with self._condition:
                    self._closing = True
                    self._failure = core.failure
            self._publish_stats()

    def _deliver(self, kv: PrefilledKV) -> None:
        """Called from the remote prefill's thread: hand arrived KV to the engine thread."""
        with self._condition:
            self._prefilled.append(kv)
            self._condition.notify()

    def _close_all(self, core: EngineCore, error: EngineError) -> None:
        with self._condition:
            self._closing = True
            arrivals, self._inbox = self._inbox, []
        for submission in arrivals:
            submission.sink.put(EngineOutput(submission.request.index, error=error))
        core.close_all(error)
        self._publish_stats()

    def _publish_stats(self) -> None:
        stats = self._core.stats()
        with self._condition:
            self._stats = stats
            self._num_held_waiting = stats.num_waiting
