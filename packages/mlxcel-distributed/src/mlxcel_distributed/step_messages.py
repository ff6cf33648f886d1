"""What rank 0 tells the other ranks of a tensor-parallel group, as flat lists of ints.

Every message is one kind code followed by its fields. A step carries what the followers
need to run the same forward pass as rank 0: the KV blocks to materialize in each block
group, the step's copy-on-write block copies and each row's tokens, block tables, offset
and logits count. A windowed group's table past the first group's is mostly null entries
behind the window: it travels as its first entry and the entries after the run of null
ones that follows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlxcel_core.cache.paged import BlockCopy
from mlxcel_core.engine import RowInput

_KV_PLAN = 1
_STEP = 2
_SHUTDOWN = 3
_ROW_HEADER = 5  # token count, offset, logits count, state slot, state source
_NO_WINDOW = 0


@dataclass(frozen=True)
class KVPlan:
    """What rank 0 planned before the first step.

    Attributes:
        num_blocks: the KV cache size, each block group's; every rank builds its pools
            with them.
        windows: each block group's window (`BlockGroups`), None for full attention;
            every rank puts its layers in the same groups.
        reports: whether the other ranks report their steps' measurements to rank 0
            (`stage_reports`); rank 0 asks for them when it records metrics.

    Raises:
        ValueError: `num_blocks` and `windows` differ in length.
    """

    num_blocks: tuple[int, ...]
    windows: tuple[int | None, ...] = (None,)
    reports: bool = False

    def __post_init__(self) -> None:
        if len(self.num_blocks) != len(self.windows):
            raise ValueError(f"a block count per window: {self.num_blocks} for {self.windows}")


@dataclass(frozen=True)
class StepMessage:
    """One engine step.

    Attributes:
        num_blocks: KV blocks materialized before the step, in each block group.
        copies: the step's copy-on-write block copies, made before its forward pass.
        rows: the rows the step computes, in rank 0's order, each with a block table
            per group.
    """

    num_blocks: tuple[int, ...]
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
        windows = [_NO_WINDOW if window is None else window for window in message.windows]
        return [_KV_PLAN, int(message.reports), len(windows), *message.num_blocks, *windows]
    if isinstance(message, Shutdown):
        return [_SHUTDOWN]
    num_groups = len(message.num_blocks)
    ints = [_STEP, num_groups, *message.num_blocks, len(message.copies)]
    for copy in message.copies:
        ints += [copy.src_block_id, copy.dst_block_id, copy.group]
    ints.append(len(message.rows))
    for row in message.rows:
        if row.adapter_scales is not None:
            raise ValueError("rows with LoRA adapter scales cannot be sent to other ranks")
        if len(row.block_tables) != num_groups:
            raise ValueError(f"a row needs {num_groups} block tables, got {len(row.block_tables)}")
        ints += [len(row.token_ids), row.offset, row.num_logits]
        ints += [_slot_int(row.state_slot), _slot_int(row.state_source)]
        first, *windowed = row.block_tables
        if any(len(table) != len(first) for table in windowed):
            raise ValueError("a row's block tables must cover the same positions")
        runs = [_null_run(table) for table in windowed]
        ints += [len(first), *runs]
        ints += row.token_ids
        ints += first
        for table, run in zip(windowed, runs, strict=True):
            ints += [*table[:1], *table[1 + run :]]
    return ints


def _null_run(table: Sequence[int]) -> int:
    """Null entries (block 0) after the table's first entry, before another."""
    run = 0
    while run + 1 < len(table) and table[run + 1] == 0:
        run += 1
    return run


def decode_message(ints: Sequence[int]) -> Message:
    """The message `encode_message` made `ints` from.

    Raises:
        ValueError: `ints` is empty, of an unknown kind, truncated or too long.
    """
    reader = _Reader(ints)
    kind = reader.take(1)[0]
    if kind == _KV_PLAN:
        reports, num_groups = reader.take(2)
        num_blocks = tuple(reader.take(num_groups))
        windows = tuple(None if w == _NO_WINDOW else w for w in reader.take(num_groups))
        message: Message = KVPlan(num_blocks, windows, bool(reports))
    elif kind == _SHUTDOWN:
        message = Shutdown()
    elif kind == _STEP:
        num_groups = reader.take(1)[0]
        num_blocks = tuple(reader.take(num_groups))
        num_copies = reader.take(1)[0]
        triples = reader.take(3 * num_copies)
        copies = tuple(BlockCopy(*triples[i : i + 3]) for i in range(0, len(triples), 3))
        rows = []
        for _ in range(reader.take(1)[0]):
            header = reader.take(_ROW_HEADER)
            num_tokens, offset, num_logits, state_slot, state_source = header
            length, *runs = reader.take(num_groups)
            tokens = reader.take(num_tokens)
            tables = [reader.take(length)]
            for run in runs:
                kept = reader.take(length - run)
                tables.append([*kept[:1], *[0] * run, *kept[1:]])
            rows.append(
                RowInput(
                    tokens,
                    tuple(tables),
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
