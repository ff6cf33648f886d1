"""Waiting for a command's next engine output, with a bound instead of a hang."""

from __future__ import annotations

import queue

from mlxcel.common.flags import RunError
from mlxcel_core.engine import EngineOutput, OutputQueue

# A reply's outputs never stop coming for this long while the engine is healthy.
OUTPUT_TIMEOUT_SECONDS = 600.0


def next_output(sink: OutputQueue, timeout: float = OUTPUT_TIMEOUT_SECONDS) -> EngineOutput:
    """The next output in `sink`, waiting at most `timeout` seconds.

    Raises:
        RunError: nothing arrived in time (the engine is stuck).
    """
    try:
        return sink.get(timeout=timeout)
    except queue.Empty:
        raise RunError(f"the engine produced nothing for {timeout:g} s; giving up") from None
