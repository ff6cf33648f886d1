"""A blocking, thread-safe output sink for synchronous callers (CLI runs, tests)."""

from __future__ import annotations

import queue

from mlxcel_core.engine.request import EngineOutput


class OutputQueue:
    """Collects a group's outputs for a thread that waits on them."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[EngineOutput] = queue.SimpleQueue()

    def put(self, output: EngineOutput) -> None:
        self._queue.put(output)

    def get(self, timeout: float | None = None) -> EngineOutput:
        """The next output, waiting at most `timeout` seconds.

        Raises:
            queue.Empty: nothing arrived in time.
        """
        return self._queue.get(timeout=timeout)
