"""A deadline on each lockstep step, watched from a thread of its own.

A collective whose peer has died raises at once on the ring backend, but one whose peer
hangs (stopped, deadlocked, swapped out) blocks rank 0's engine thread inside MLX with no
way to interrupt it. The watchdog sees such a step overrun the stage timeout and reports
it, so the server can answer while the engine thread is stuck.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class StepWatchdog:
    """Calls `on_overrun` once when a step runs longer than `timeout` seconds.

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
        self._closed = False
        self._thread = threading.Thread(target=self._watch, name="mlxcel-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def step(self) -> Iterator[None]:
        """Time the body as one step."""
        with self._condition:
            self._started_at = time.monotonic()
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
                if elapsed < self.timeout:
                    self._condition.wait(self.timeout - elapsed)
                    continue
                break
            else:
                return
        self._on_overrun(elapsed)
