"""Rank 0 → every other rank: step messages over `mx.distributed` collectives.

A message travels as an all-sum to which rank 0 adds its ints and every other rank adds
zeros, so it reaches all ranks whatever the backend's topology. It goes in a fixed frame of
`FRAME_INTS` ints, the first holding the message's length; a message longer than the frame
(a prefill chunk's tokens) sends the rest in a second all-sum of exactly that size. A decode
step of a few rows fits in one frame: one collective per step, beside the two per layer the
sharded model makes. Rank 0 sending the frame to each rank costs it less (benchmarks.md,
`benchmarks/step_channel.py`), but the step's first layer waits for every rank anyway, and
the all-sum works on every backend and group shape.

A pipeline's ranks take the same frames point to point instead (`PipelineChannel`): rank 0
sends them to rank 1, and each rank passes them on to the next as it receives them. An
all-sum would make every stage wait for the last one to finish its step before the next
message could pass, so no two stages could work on different steps.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import numpy as np

from mlxcel_distributed.step_messages import Message, decode_message, encode_message

FRAME_INTS = 256


class StepChannel:
    """Sends messages from rank 0 of `group` and receives them on the others.

    Every rank must take part in each message, in the same order: rank 0 by `send`, the
    others by `receive`.

    Args:
        group: the tensor-parallel group.
    """

    def __init__(self, group: mx.distributed.Group) -> None:
        self.group = group

    def send(self, message: Message) -> int:
        """Send `message` to every other rank (rank 0 only).

        Returns:
            The bytes rank 0 put into the all-sums (its frames, int32).

        Raises:
            ValueError: the message cannot be encoded (`encode_message`).
        """
        frames = _frames(message)
        for frame in frames:
            self._all_sum(frame)
        return sum(frame.nbytes for frame in frames)

    def receive(self) -> Message:
        """The next message rank 0 sends (ranks > 0 only).

        Raises:
            ValueError: what arrived is not a message (`decode_message`).
        """
        return _read_frames(lambda size: self._all_sum(np.zeros(size, dtype=np.int32)))

    def _all_sum(self, ints: np.ndarray) -> np.ndarray:
        return np.array(mx.distributed.all_sum(mx.array(ints), group=self.group))


class PipelineChannel:
    """`StepChannel`'s messages down a pipeline: rank 0 sends each to rank 1, and every
    rank but the last passes what it receives to the next before decoding it.

    Every rank must take part in each message, in the same order: rank 0 by `send`, the
    others by `receive`.

    Args:
        group: the pipeline's group, one stage per rank.
    """

    def __init__(self, group: mx.distributed.Group) -> None:
        self.group = group
        rank = group.rank()
        self._next = rank + 1 if rank + 1 < group.size() else None

    def send(self, message: Message) -> int:
        """Send `message` down the pipeline (rank 0 only).

        Returns:
            The bytes rank 0 sent (its frames, int32).

        Raises:
            ValueError: the message cannot be encoded (`encode_message`).
        """
        frames = _frames(message)
        for frame in frames:
            mx.eval(mx.distributed.send(mx.array(frame), 1, group=self.group))
        return sum(frame.nbytes for frame in frames)

    def receive(self) -> Message:
        """The next message rank 0 sends (ranks > 0 only), passed on to the next rank.

        Raises:
            ValueError: what arrived is not a message (`decode_message`).
        """
        return _read_frames(self._receive_frame)

    def _receive_frame(self, size: int) -> np.ndarray:
        source = self.group.rank() - 1
        frame = mx.distributed.recv((size,), mx.int32, source, group=self.group)
        mx.eval(frame)
        if self._next is not None:
            mx.eval(mx.distributed.send(frame, self._next, group=self.group))
        return np.array(frame)


Channel = StepChannel | PipelineChannel
"""Either way rank 0's messages reach the other ranks; both have `send` and `receive`."""


def _frames(message: Message) -> list[np.ndarray]:
    """The message as it travels: a frame of `FRAME_INTS` ints, its length first, and the
    ints that do not fit it, if any."""
    ints = encode_message(message)
    frame = np.zeros(FRAME_INTS, dtype=np.int32)
    frame[0] = len(ints)
    head = ints[: FRAME_INTS - 1]
    frame[1 : 1 + len(head)] = head
    if len(ints) == len(head):
        return [frame]
    return [frame, np.asarray(ints[len(head) :], dtype=np.int32)]


def _read_frames(receive: Callable[[int], np.ndarray]) -> Message:
    """Decode the frames `receive(size)` returns, one call per frame."""
    frame = receive(FRAME_INTS)
    length = int(frame[0])
    ints = frame[1 : 1 + min(length, FRAME_INTS - 1)].tolist()
    if length > len(ints):
        ints += receive(length - len(ints)).tolist()
    return decode_message(ints)
