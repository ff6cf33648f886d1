"""MLX streams for worker threads."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx

# The side streams each thread has made (`side_streams`), by device and count.
_side_streams = threading.local()


@contextmanager
def thread_stream(device: mx.Device | None = None) -> Iterator[mx.Stream]:
    """Run the block on a new MLX stream owned by the current thread.

    MLX streams belong to the thread that creates them, so a worker thread needs its own.
    Streams a thread leaves behind are torn down at process exit, which sometimes aborts
    the process ("terminate called without an active exception", ml-explore/mlx#3126);
    `mx.clear_streams()` destroys them, the thread's side streams included, while the
    thread is still alive.

    Args:
        device: the stream's device; None for the default device.
    """
    stream = mx.new_stream(device or mx.default_device())
    try:
        with mx.stream(stream):
            yield stream
    finally:
        _side_streams.__dict__.clear()
        mx.clear_streams()


def side_streams(device: mx.Device, count: int) -> tuple[mx.Stream, ...]:
    """`count` streams of `device` owned by the current thread, made on the first call and
    the same on later ones until the thread's `thread_stream` block ends.

    MLX runs each CPU stream's operations on a thread of its own, so independent products
    put on different CPU streams run on different cores.

    Raises:
        ValueError: `count` < 1.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    key = (str(device), count)
    streams = _side_streams.__dict__.get(key)
    if streams is None:
        streams = tuple(mx.new_stream(device) for _ in range(count))
        _side_streams.__dict__[key] = streams
    return streams
