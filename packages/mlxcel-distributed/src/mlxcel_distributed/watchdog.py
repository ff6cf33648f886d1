"""A deadline on each step rank 0 waits on other ranks for (a lockstep step, a prefill
job), watched from a thread of its own.

A collective whose peer has died raises at once on the ring backend, but one whose peer
hangs (stopped, deadlocked, swapped out) blocks the waiting thread inside MLX with no
way to interrupt it. The watchdog sees such a step overrun its limit and reports it, so
the server can answer while that thread is stuck.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class StepWatchdog:
    """Calls `on_overrun` once when a step runs longer than its limit: `timeout` seconds,
    or the limit the step was given.

    Args:
        timeout: the stage timeout (seconds, > 0).
        on_overrun: called on the watchdog's thread with the seconds the step had run.

    Raises:
        ValueError: `timeout` is not positive.
    """

    def __init__(self, timeout: float, on_overrun: Callable[[float], None]) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.timeout = timeout
        self._on_overrun = on_overrun
        self._condition = threading.Condition()
        self._started_at: float | None = None
        self._limit = timeout
        self._closed = False
        self._thread = threading.Thread(target=self._watch, name="mlxcel-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def step(self, limit: float | None = None) -> Iterator[None]:
        """Time the body as one step, held to `limit` seconds (None: `timeout`).

        Raises:
            ValueError: `limit` is not positive.
        """
        if limit is not None and limit <= 0:
            raise ValueError(f"limit must be > 0 seconds, got {limit}")
        with self._condition:
            self._started_at = time.monotonic()
            self._limit = self.timeout if limit is None else limit
            self._condition.notify_all()
        try:
            yield
        finally:
            with self._condition:
                self._started_at = None
                self._condition.notify_all()

    def close(self) -> None:
        """Stop watching and end the watchdog's thread."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()
        self._thread.join()

    def _watch(self) -> None:
        with self._condition:
            while not self._closed:
                started_at = self._started_at
                if started_at is None:
                    self._condition.wait()
                    continue
                elapsed = time.monotonic() - started_at
                if elapsed < self._limit:
                    self._condition.wait(self._limit - elapsed)
                    continue
                break
            else:
                return
        self._on_overrun(elapsed)
