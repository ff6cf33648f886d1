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

The first frame ends in a region where the followers report their own step times to rank
0 (`stage_reports`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from mlxcel_distributed.stage_reports import (
    StageReport,
    read_reports,
    region_size,
    write_report,
)
from mlxcel_distributed.step_messages import Message, decode_message, encode_message

# The message part of the first frame: its length, then up to FRAME_INTS - 1 of its ints.
FRAME_INTS = 256


@dataclass(frozen=True)
class Sent:
    """What sending a message gave rank 0.

    Attributes:
        nbytes: the bytes rank 0 sent (its frames, int32).
        reports: the followers' reports that came back with the message, by rank
            (`StepChannel`; a `PipelineChannel` returns them with the logits instead).
    """

    nbytes: int
    reports: dict[int, StageReport] = field(default_factory=dict)


class StepChannel:
    """Sends messages from rank 0 of `group` and receives them on the others.

    Every rank must take part in each message, in the same order: rank 0 by `send`, the
    others by `receive`. A follower's latest `report` goes back with the next message.

    Args:
        group: the tensor-parallel group.
    """

    def __init__(self, group: mx.distributed.Group) -> None:
        self.group = group
        self._region_size = region_size(group.size())
        self._report: StageReport | None = None

    def send(self, message: Message) -> Sent:
        """Send `message` to every other rank (rank 0 only).

        Returns:
            The bytes rank 0 put into the all-sums, and the followers' reports added to
            the first.

        Raises:
            ValueError: the message cannot be encoded (`encode_message`).
        """
        frames = _frames(message, self._region_size)
        summed = [self._all_sum(frame) for frame in frames]
        region = summed[0][FRAME_INTS:]
        return Sent(sum(frame.nbytes for frame in frames), read_reports(region))

    def receive(self) -> Message:
        """The next message rank 0 sends (ranks > 0 only); this rank's latest report, if
        any is not sent yet, goes into the same all-sum.

        Raises:
            ValueError: what arrived is not a message (`decode_message`).
        """
        first = np.zeros(FRAME_INTS + self._region_size, dtype=np.int32)
        if self._report is not None:
            write_report(first[FRAME_INTS:], self.group.rank(), self._report)
            self._report = None
        return _read_frames(
            self._all_sum(first), lambda size: self._all_sum(np.zeros(size, dtype=np.int32))
        )

    def report(self, report: StageReport) -> None:
        """Keep this follower's report of its latest step for the next `receive`."""
        self._report = report

    def _all_sum(self, ints: np.ndarray) -> np.ndarray:
        return np.array(mx.distributed.all_sum(mx.array(ints), group=self.group))


class PipelineChannel:
    """`StepChannel`'s messages down a pipeline: rank 0 sends each to rank 1, and every
    rank but the last passes what it receives to the next before decoding it.

    Every rank must take part in each message, in the same order: rank 0 by `send`, the
    others by `receive`. Every follower calls `report` once per step; the reports go back
    to rank 0 in the last rank's transfer of the step's logits (`read_reports` decodes
    them).

    Args:
        group: the pipeline's group, one stage per rank.
    """

    def __init__(self, group: mx.distributed.Group) -> None:
        self.group = group
        self._rank = group.rank()
        self._last = group.size() - 1
        self._region = np.zeros(region_size(group.size()), dtype=np.int32)
        self._report: StageReport | None = None

    def send(self, message: Message) -> Sent:
        """Send `message` down the pipeline (rank 0 only).

        Returns:
            The bytes rank 0 sent; no reports (they come with the step's logits).

        Raises:
            ValueError: the message cannot be encoded (`encode_message`).
        """
        frames = _frames(message, len(self._region))
        for frame in frames:
            mx.eval(mx.distributed.send(mx.array(frame), 1, group=self.group))
        return Sent(sum(frame.nbytes for frame in frames))

    def receive(self) -> Message:
        """The next message rank 0 sends (ranks > 0 only), passed on to the next rank with
        this rank's latest report, if any is not sent yet, in its slot.

        Raises:
            ValueError: what arrived is not a message (`decode_message`).
        """
        first = self._receive_frame(FRAME_INTS + len(self._region))
        region = first[FRAME_INTS:]
        if self._report is not None:
            write_report(region, self._rank, self._report)
            self._report = None
        if self._rank == self._last:
            self._region = region
        else:
            self._pass_on(first)
        return _read_frames(first, self._receive_and_pass_on)

    def report(self, report: StageReport) -> np.ndarray | None:
        """After each step's output is computed (ranks > 0 only): a middle rank keeps
        `report` for the next message it passes on (None); the last rank returns the
        reports to send to rank 0 with the step's logits (int32, `region_ints` long): its
        own, and the middle ranks' that came down with the step's message."""
        if self._rank != self._last:
            self._report = report
            return None
        write_report(self._region, self._rank, report)
        return self._region.copy()

    @property
    def region_ints(self) -> int:
        """The int32 values of the reports the last rank sends with each step's logits."""
        return len(self._region)

    def _receive_frame(self, size: int) -> np.ndarray:
        frame = mx.distributed.recv((size,), mx.int32, self._rank - 1, group=self.group)
        return np.array(frame)

    def _receive_and_pass_on(self, size: int) -> np.ndarray:
        frame = self._receive_frame(size)
        if self._rank != self._last:
            self._pass_on(frame)
        return frame

    def _pass_on(self, frame: np.ndarray) -> None:
        mx.eval(mx.distributed.send(mx.array(frame), self._rank + 1, group=self.group))


Channel = StepChannel | PipelineChannel
"""Either way rank 0's messages reach the other ranks; both have `send` and `receive`."""


def _frames(message: Message, region_ints: int) -> list[np.ndarray]:
    """The message as it travels: a first frame of `FRAME_INTS` ints, its length first,
    then `region_ints` zeros for the followers' reports; and the message's ints that do
    not fit it, if any."""
    ints = encode_message(message)
    frame = np.zeros(FRAME_INTS + region_ints, dtype=np.int32)
    frame[0] = len(ints)
    head = ints[: FRAME_INTS - 1]
    frame[1 : 1 + len(head)] = head
    if len(ints) == len(head):
        return [frame]
    return [frame, np.asarray(ints[len(head) :], dtype=np.int32)]


def _read_frames(first: np.ndarray, receive: Callable[[int], np.ndarray]) -> Message:
    """Decode the message whose first frame is `first`, calling `receive(size)` for the
    rest when it did not fit."""
    length = int(first[0])
    ints = first[1 : 1 + min(length, FRAME_INTS - 1)].tolist()
    if length > len(ints):
        ints += receive(length - len(ints)).tolist()
    return decode_message(ints)
