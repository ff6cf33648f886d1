"""What rank 0 tells the other ranks of a tensor-parallel group, as flat lists of ints.

Every message is one kind code followed by its fields. A step carries what the followers
need to run the same forward pass as rank 0: the KV blocks to materialize, the step's
copy-on-write block copies and each row's tokens, block table, offset and logits count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlxcel_core.cache.paged import BlockCopy
from mlxcel_core.engine import RowInput

_KV_PLAN = 1
_STEP = 2
_SHUTDOWN = 3
_ROW_HEADER = 6  # token count, block count, offset, logits count, state slot, state source


@dataclass(frozen=True)
class KVPlan:
    """What rank 0 planned before the first step.

    Attributes:
        num_blocks: the KV cache size; every rank builds its pools with it.
        reports: whether the other ranks report their steps' measurements to rank 0
            (`stage_reports`); rank 0 asks for them when it records metrics.
    """

    num_blocks: int
    reports: bool = False


@dataclass(frozen=True)
class StepMessage:
    """One engine step.

    Attributes:
        num_blocks: KV blocks materialized before the step.
        copies: the step's copy-on-write block copies, made before its forward pass.
        rows: the rows the step computes, in rank 0's order.
    """

    num_blocks: int
    copies: tuple[BlockCopy, ...]
    rows: tuple[RowInput, ...]


@dataclass(frozen=True)
class Shutdown:
    """Rank 0's engine has stopped: the followers leave their loop."""


Message = KVPlan | StepMessage | Shutdown


def encode_message(message: Message) -> list[int]:
    """The message as ints (each fits int32: token ids, block ids, positions).

    Raises:
        ValueError: a row carries LoRA adapter scales, which followers cannot replay.
    """
    if isinstance(message, KVPlan):
        return [_KV_PLAN, message.num_blocks, int(message.reports)]
    if isinstance(message, Shutdown):
        return [_SHUTDOWN]
    ints = [_STEP, message.num_blocks, len(message.copies)]
    for copy in message.copies:
        ints += [copy.src_block_id, copy.dst_block_id]
    ints.append(len(message.rows))
    for row in message.rows:
        if row.adapter_scales is not None:
            raise ValueError("rows with LoRA adapter scales cannot be sent to other ranks")
        ints += [len(row.token_ids), len(row.block_table), row.offset, row.num_logits]
        ints += [_slot_int(row.state_slot), _slot_int(row.state_source)]
        ints += [*row.token_ids, *row.block_table]
    return ints


def decode_message(ints: Sequence[int]) -> Message:
    """The message `encode_message` made `ints` from.

    Raises:
        ValueError: `ints` is empty, of an unknown kind, truncated or too long.
    """
    reader = _Reader(ints)
    kind = reader.take(1)[0]
    if kind == _KV_PLAN:
        num_blocks, reports = reader.take(2)
        message: Message = KVPlan(num_blocks, bool(reports))
    elif kind == _SHUTDOWN:
        message = Shutdown()
    elif kind == _STEP:
        num_blocks, num_copies = reader.take(2)
        pairs = reader.take(2 * num_copies)
        copies = tuple(BlockCopy(pairs[i], pairs[i + 1]) for i in range(0, len(pairs), 2))
        rows = []
        for _ in range(reader.take(1)[0]):
            header = reader.take(_ROW_HEADER)
            num_tokens, num_table, offset, num_logits, state_slot, state_source = header
            tokens = reader.take(num_tokens)
            rows.append(
                RowInput(
                    tokens,
                    reader.take(num_table),
                    offset,
                    num_logits,
                    state_slot=_int_slot(state_slot),
                    state_source=_int_slot(state_source),
                )
            )
        message = StepMessage(num_blocks, copies, tuple(rows))
    else:
        raise ValueError(f"unknown step message kind {kind}")
    reader.check_consumed()
    return message


def _slot_int(slot: int | None) -> int:
    """A state slot as a non-negative int: 0 for none, else the slot plus one."""
    return 0 if slot is None else slot + 1


def _int_slot(value: int) -> int | None:
    return None if value == 0 else value - 1


class _Reader:
    def __init__(self, ints: Sequence[int]) -> None:
        self._ints = [int(i) for i in ints]
        self._position = 0

    def take(self, count: int) -> list[int]:
        end = self._position + count
        if count < 0 or end > len(self._ints):
            raise ValueError(
                f"truncated step message: needed {count} more ints at {self._position} "
                f"of {len(self._ints)}"
            )
        taken = self._ints[self._position : end]
        self._position = end
        return taken

    def check_consumed(self) -> None:
        if self._position != len(self._ints):
            raise ValueError(
                f"step message has {len(self._ints) - self._position} ints past its end"
            )
