"""The engine: one inference thread running requests from a bounded waiting queue.

Requests run one at a time, in arrival order. The continuous-batching engine will replace
this scheduling behind the same interface (`submit`, `RequestHandle.cancel`, `shutdown`).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from mlxcel_core.engine.request import (
    EngineClosedError,
    EngineOutput,
    EngineOverloadedError,
    EngineRequest,
    OutputSink,
    RequestCancelledError,
    RequestHandle,
)
from mlxcel_core.generate import LanguageModel, stream_generate
from mlxcel_core.sampling import Sampler
from mlxcel_core.threads import thread_stream


@dataclass(frozen=True)
class EngineConfig:
    """Settings of the engine.

    Attributes:
        max_waiting: most requests (sequences, not groups) waiting to run; a submission
            that would exceed it raises `EngineOverloadedError`.
        retry_after_seconds: the retry hint carried by `EngineOverloadedError`.
    """

    max_waiting: int = 64
    retry_after_seconds: int = 1

    def __post_init__(self) -> None:
        if self.max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {self.max_waiting}")
        if self.retry_after_seconds < 0:
            raise ValueError(f"retry_after_seconds must be >= 0, got {self.retry_after_seconds}")


@dataclass(frozen=True)
class _Job:
    request: EngineRequest
    sink: OutputSink
    handle: RequestHandle


class Engine:
    """Runs generation requests on one dedicated thread.

    All MLX work of the requests happens on that thread, in an MLX stream of its own;
    callers only submit, read their sink and cancel.

    Args:
        model: the language model; its weights must already be evaluated.
        config: queue limits.
    """

    def __init__(self, model: LanguageModel, config: EngineConfig | None = None) -> None:
        self._model = model
        self._config = EngineConfig() if config is None else config
        self._condition = threading.Condition()
        self._waiting: deque[_Job] = deque()
        self._num_running = 0
        self._closing = False
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._loop, name="mlxcel-engine", daemon=True)
        self._thread.start()

    @property
    def num_waiting(self) -> int:
        """Requests queued and not yet started."""
        with self._condition:
            return len(self._waiting)

    @property
    def num_running(self) -> int:
        """Requests being generated now (0 or 1)."""
        with self._condition:
            return self._num_running

    def submit(self, requests: Sequence[EngineRequest], sink: OutputSink) -> RequestHandle:
        """Queue a group of requests (e.g. the `n` choices of one API call), all or none.

        Each request's outputs go to `sink` in order, tagged with its `index`, ending with
        one terminal output.

        Raises:
            ValueError: `requests` is empty.
            EngineOverloadedError: the waiting queue has no room for the whole group.
            EngineClosedError: the engine is shutting down.
        """
        if not requests:
            raise ValueError("requests must hold at least one request")
        handle = RequestHandle(next(self._ids))
        with self._condition:
            if self._closing:
                raise EngineClosedError("the engine is shutting down")
            if len(self._waiting) + len(requests) > self._config.max_waiting:
                raise EngineOverloadedError(
                    f"the server is busy: {len(self._waiting)} requests are waiting "
                    f"(limit {self._config.max_waiting}); retry later",
                    retry_after_seconds=self._config.retry_after_seconds,
                )
            self._waiting.extend(_Job(request, sink, handle) for request in requests)
            self._condition.notify()
        return handle

    def shutdown(self, timeout: float | None = None) -> None:
        """Refuse new requests, end waiting and running ones, and join the thread.

        Waiting requests and the running one end with an `EngineClosedError` output (the
        running one within one decode step). Safe to call more than once.

        Raises:
            TimeoutError: the thread did not end within `timeout` seconds.
        """
        with self._condition:
            self._closing = True
            dropped = list(self._waiting)
            self._waiting.clear()
            self._condition.notify_all()
        for job in dropped:
            job.sink.put(_closed_output(job.request.index))
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the engine thread did not stop within {timeout} s")

    def _loop(self) -> None:
        with thread_stream():
            while True:
                with self._condition:
                    while not self._waiting and not self._closing:
                        self._condition.wait()
                    if self._closing:
                        return
                    job = self._waiting.popleft()
                    self._num_running = 1
                try:
                    self._run(job)
                finally:
                    with self._condition:
                        self._num_running = 0

    def _interrupted(self, handle: RequestHandle, index: int) -> EngineOutput | None:
        if handle.cancelled:
            return EngineOutput(index, error=RequestCancelledError("the request was cancelled"))
        if self._closing:
            return _closed_output(index)
        return None

    def _run(self, job: _Job) -> None:
        request, sink = job.request, job.sink
        stop = self._interrupted(job.handle, request.index)
        if stop is not None:
            sink.put(stop)
            return
        try:
            sampler = Sampler(request.sampling, dry_breaker_ids=request.dry_breaker_ids)
            chunks = stream_generate(
                self._model,
                list(request.prompt_ids),
                sampler,
                request.detokenizer,
                request.generation,
                constraint=request.constraint,
            )
            for chunk in chunks:
                stop = self._interrupted(job.handle, request.index)
                if stop is not None:
                    chunks.close()
                    sink.put(stop)
                    return
                sink.put(
                    EngineOutput(
                        request.index,
                        chunk.text,
                        chunk.token_id,
                        chunk.finish_reason,
                        chunk.stats,
                        sampler.seed,
                        logprobs=chunk.logprobs,
                    )
                )
        # A failure of one request (a model error, an MLX error) must end that request with
        # its error, not the thread every other request depends on.
        except Exception as error:
            sink.put(EngineOutput(request.index, error=error))


def _closed_output(index: int) -> EngineOutput:
    return EngineOutput(index, error=EngineClosedError("the server is shutting down"))
