"""MLX streams for worker threads."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx


@contextmanager
def thread_stream(device: mx.Device | None = None) -> Iterator[mx.Stream]:
    """Run the block on a new MLX stream owned by the current thread.

    MLX streams belong to the thread that creates them, so a worker thread needs its own.
    Streams a thread leaves behind are torn down at process exit, which sometimes aborts
    the process ("terminate called without an active exception", ml-explore/mlx#3126);
    `mx.clear_streams()` destroys them while the thread is still alive.

    Args:
        device: the stream's device; None for the default device.
    """
    stream = mx.new_stream(device or mx.default_device())
    try:
        with mx.stream(stream):
            yield stream
    finally:
        mx.clear_streams()
