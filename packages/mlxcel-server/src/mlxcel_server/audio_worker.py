"""The audio worker: one thread, with its own MLX stream, that runs speech work in order,
off the event loop.

A job is a function returning an iterator (one transcript, or one audio array per sentence).
Its items reach the awaiting handler through the handler's event loop. Admission is bounded
like the engine's: a submission that finds `max_waiting` jobs already waiting is refused.
When the handler stops listening (the client went away), the job is cancelled: a waiting job
never starts, a running one stops before its next item.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from mlxcel_core.errors import MlxcelError
from mlxcel_core.threads import thread_stream

T = TypeVar("T")


class AudioOverloadedError(MlxcelError):
    """The worker has `max_waiting` jobs waiting already.

    Attributes:
        retry_after_seconds: a hint for how long to wait before retrying.
    """

    def __init__(self, message: str, *, retry_after_seconds: int) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class AudioWorkerClosedError(MlxcelError):
    """The worker is shutting down."""


_DONE = object()


@dataclass
class _Job(Generic[T]):
    work: Callable[[], Iterator[T]]
    loop: asyncio.AbstractEventLoop
    outputs: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def send(self, item: object) -> None:
        try:
            self.loop.call_soon_threadsafe(self.outputs.put_nowait, item)
        except RuntimeError:
            # The handler's loop is gone (the client left and the request ended).
            self.cancelled.set()


class AudioWorker:
    """Runs audio jobs one at a time on its own thread.

    Args:
        max_waiting: most jobs waiting to start; more are refused.
        retry_after_seconds: the retry hint carried by `AudioOverloadedError`.

    Raises:
        ValueError: `max_waiting` < 1 or `retry_after_seconds` < 0.
    """

    def __init__(self, *, max_waiting: int, retry_after_seconds: int) -> None:
        if max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1, got {max_waiting}")
        if retry_after_seconds < 0:
            raise ValueError(f"retry_after_seconds must be >= 0, got {retry_after_seconds}")
        self._max_waiting = max_waiting
        self._retry_after_seconds = retry_after_seconds
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._num_waiting = 0
        self._num_running = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="mlxcel-audio", daemon=True)
        self._thread.start()

    @property
    def num_waiting(self) -> int:
        """Jobs submitted and not started."""
        return self._num_waiting

    @property
    def num_running(self) -> int:
        """Jobs running now (0 or 1)."""
        return self._num_running

    def submit(self, work: Callable[[], Iterator[T]]) -> AsyncGenerator[T, None]:
        """Queue `work`; call it on the worker thread and hand its items to the caller's loop.

        Admission happens now, so a refusal comes before the caller answers anything.

        Returns:
            The job's items in order; an exception `work` raises is raised from it. Leaving
            the iteration early (or a cancelled await) cancels the job.

        Raises:
            AudioOverloadedError: `max_waiting` jobs are waiting.
            AudioWorkerClosedError: the worker is shutting down.
        """
        job: _Job[T] = _Job(work, asyncio.get_running_loop())
        with self._lock:
            if self._closed:
                raise AudioWorkerClosedError("the server is shutting down")
            if self._num_waiting >= self._max_waiting:
                raise AudioOverloadedError(
                    f"the server is busy: {self._num_waiting} audio requests are waiting "
                    f"(limit {self._max_waiting}); retry later",
                    retry_after_seconds=self._retry_after_seconds,
                )
            self._num_waiting += 1
            self._jobs.put(job)
        return self._items(job)

    async def _items(self, job: _Job[T]) -> AsyncGenerator[T, None]:
        try:
            while True:
                item = await job.outputs.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            job.cancelled.set()

    def _run(self) -> None:
        with thread_stream():
            self._run_jobs()

    def _run_jobs(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self._lock:
                self._num_waiting -= 1
                if job.cancelled.is_set():
                    continue
                self._num_running = 1
            try:
                self._run_job(job)
            finally:
                with self._lock:
                    self._num_running = 0

    @staticmethod
    def _run_job(job: _Job) -> None:
        try:
            for item in job.work():
                if job.cancelled.is_set():
                    return
                job.send(item)
        except Exception as error:  # handed to the handler, which decides what the client sees
            job.send(error)
            return
        job.send(_DONE)

    def shutdown(self, timeout: float | None = None) -> None:
        """Refuse new jobs, cancel waiting ones and join the thread after the running job.

        Safe to call more than once.
        """
        with self._lock:
            if not self._closed:
                self._closed = True
                self._jobs.put(None)
        self._drain_waiting()
        self._thread.join(timeout)

    def _drain_waiting(self) -> None:
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is None:
                # Put the stop marker back for the thread.
                self._jobs.put(None)
                break
            with self._lock:
                self._num_waiting -= 1
            job.send(AudioWorkerClosedError("the server is shutting down"))
