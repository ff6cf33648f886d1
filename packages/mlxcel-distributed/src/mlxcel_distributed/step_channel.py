"""Rank 0 → every other rank: step messages over `mx.distributed` collectives.

A message travels as an all-sum to which rank 0 adds its ints and every other rank adds
zeros, so it reaches all ranks whatever the backend's topology. It goes in a fixed frame of
`FRAME_INTS` ints, the first holding the message's length; a message longer than the frame
(a prefill chunk's tokens) sends the rest in a second all-sum of exactly that size. A decode
step of a few rows fits in one frame: one collective per step, beside the two per layer the
sharded model makes. Rank 0 sending the frame to each rank costs it less (benchmarks.md,
`benchmarks/step_channel.py`), but the step's first layer waits for every rank anyway, and
the all-sum works on every backend and group shape.
"""

from __future__ import annotations

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
        ints = encode_message(message)
        frame = np.zeros(FRAME_INTS, dtype=np.int32)
        frame[0] = len(ints)
        head = ints[: FRAME_INTS - 1]
        frame[1 : 1 + len(head)] = head
        self._all_sum(frame)
        if len(ints) == len(head):
            return frame.nbytes
        rest = np.asarray(ints[len(head) :], dtype=np.int32)
        self._all_sum(rest)
        return frame.nbytes + rest.nbytes

    def receive(self) -> Message:
        """The next message rank 0 sends (ranks > 0 only).

        Raises:
            ValueError: what arrived is not a message (`decode_message`).
        """
        frame = self._all_sum(np.zeros(FRAME_INTS, dtype=np.int32))
        length = int(frame[0])
        ints = frame[1 : 1 + min(length, FRAME_INTS - 1)].tolist()
        if length > len(ints):
            ints += self._all_sum(np.zeros(length - len(ints), dtype=np.int32)).tolist()
        return decode_message(ints)

    def _all_sum(self, ints: np.ndarray) -> np.ndarray:
        return np.array(mx.distributed.all_sum(mx.array(ints), group=self.group))
