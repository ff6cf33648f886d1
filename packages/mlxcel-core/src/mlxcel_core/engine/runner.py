"""The model runner: one step's forward passes over the paged KV cache.

It makes no decisions: it is told which tokens of which sequences to compute and returns
the logits the engine samples from. It builds each pass's per-layer caches from the
model's cache layout (`mlxcel_core.cache.layout`): attention parts view the paged pools,
state parts view the rows' state slots (`mlxcel_core.cache.state`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol, cast, runtime_checkable

import mlx.core as mx

from mlxcel_core.adapters import AdapterScales, RowAdapterScales
from mlxcel_core.cache.layout import CacheLayout, model_cache_layout
from mlxcel_core.cache.paged import (
    BatchRow,
    BlockCopy,
    PagedBatch,
    PagedKVStorage,
    PagedLayerCache,
    make_layer_caches,
)
from mlxcel_core.cache.state import CompositeCache, SlotStateCache, make_state_caches
from mlxcel_core.images import ImageLanguageModel, PromptImage, RowImages
from mlxcel_core.language_model import LanguageModel


@dataclass(frozen=True)
class PendingToken:
    """A token sampled by a step the host has not read yet: `tokens[index]`.

    Attributes:
        tokens: (n,) int32 token ids of one draw, lazy or evaluated.
        index: the token's place in `tokens`.
    """

    tokens: mx.array
    index: int


@dataclass(frozen=True)
class RowInput:
    """One sequence's tokens for this step.

    Attributes:
        token_ids: the tokens to compute, at positions `offset` on (at least one).
        block_tables: the sequence's blocks in each block group (`KVCacheManager.
            block_tables`), each covering `offset + len(token_ids)` positions.
        offset: positions already in the cache.
        num_logits: 1 for the logits after the last token only, or `len(token_ids)` for
            the logits after every token (verifying draft tokens).
        adapter_scales: the sequence's LoRA adapter scales; None without unfused adapters.
        images: all of the sequence's prompt images (also those outside this step's
            tokens), for a model with vision support; empty for text.
        state_slot: the sequence's recurrent state slot (its running slot), for a model
            with state layers; None for others.
        state_source: a slot whose state this row starts from, copied into `state_slot`
            before the step's passes (a forked choice); None continues from its own, or
            from nothing when `offset` is 0.
        pending: the row's one token when the host does not know it yet (the token the
            step before sampled, async scheduling); `token_ids` then holds a placeholder.

    Raises:
        ValueError: `token_ids` or `block_tables` is empty, `num_logits` is neither of
            those, or a pending row has more than one token.
    """

    token_ids: Sequence[int]
    block_tables: Sequence[Sequence[int]]
    offset: int
    num_logits: int = 1
    adapter_scales: AdapterScales | None = None
    images: tuple[PromptImage, ...] = ()
    state_slot: int | None = None
    state_source: int | None = None
    pending: PendingToken | None = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise ValueError("token_ids must hold at least one token")
        if not self.block_tables:
            raise ValueError("block_tables must hold one table per block group")
        if self.pending is not None and len(self.token_ids) != 1:
            raise ValueError(f"a row with a pending token has one token, got {len(self.token_ids)}")
        if self.num_logits not in (1, len(self.token_ids)):
            raise ValueError(
                f"num_logits must be 1 or len(token_ids) ({len(self.token_ids)}), "
                f"got {self.num_logits}"
            )


def pass_groups(
    rows: Sequence[RowInput], *, separate_fresh: bool = False, one_row: bool = False
) -> list[list[int]]:
    """The step's forward passes: indices of rows of the same length and logits count, so
    no row is padded to another's length; in the order of each group's first row. With
    `separate_fresh`, rows starting from nothing (offset 0) never share a pass with rows
    continuing a state, so a recurrent layer sees either no state or every row's. With
    `one_row`, every row is a pass of its own."""
    if one_row:
        return [[i] for i in range(len(rows))]
    groups: dict[tuple[int, int, bool], list[int]] = {}
    for i, row in enumerate(rows):
        fresh = separate_fresh and row.offset == 0
        groups.setdefault((len(row.token_ids), row.num_logits, fresh), []).append(i)
    return list(groups.values())


@runtime_checkable
class RowBatchingModel(Protocol):
    """A model that says whether rows of different contexts may share a forward pass; a
    model without it is taken to batch them."""

    @property
    def batches_rows(self) -> bool:
        """False for a model that assumes one context per pass: it reads its caches'
        `offset` as one integer (position embeddings indexed by it, masks built from
        it), or takes positions from the context's length. The engine then runs each row
        as a pass of its own, and the caches' `offset` is an int."""
        ...


def model_batches_rows(model: object) -> bool:
    """The model's `RowBatchingModel.batches_rows`, else True."""
    return model.batches_rows if isinstance(model, RowBatchingModel) else True


def pass_tokens(rows: Sequence[RowInput]) -> mx.array:
    """(B, L) int32 tokens of one pass's rows, pending tokens read on the device.

    Rows that are each draw's tokens in order (a batch of decode rows running ahead) take
    that draw's array as it is; otherwise each draw's pending tokens are gathered with one
    op and put in place of the placeholders.
    """
    draws: dict[int, tuple[mx.array, list[int], list[int]]] = {}
    for i, row in enumerate(rows):
        if row.pending is not None:
            source = row.pending.tokens
            _, positions, indices = draws.setdefault(id(source), (source, [], []))
            positions.append(i)
            indices.append(row.pending.index)
    if len(draws) == 1:
        source, positions, indices = next(iter(draws.values()))
        if len(positions) == len(rows) and indices == list(range(source.shape[0])):
            return source[:, None]
    tokens = mx.array([list(row.token_ids) for row in rows], dtype=mx.int32)
    for source, positions, indices in draws.values():
        gather = [0] * len(rows)
        mask = [False] * len(rows)
        for position, index in zip(positions, indices, strict=True):
            gather[position], mask[position] = index, True
        tokens = mx.where(mx.array(mask)[:, None], source[mx.array(gather)][:, None], tokens)
    return tokens


class StepLogits:
    """One step's logits, held as the batched forward passes returned them, so that many
    rows' logits can be read with one op."""

    def __init__(self) -> None:
        self._passes: list[mx.array] = []
        self._where: dict[int, tuple[int, int]] = {}

    def add(self, rows: Sequence[int], logits: mx.array) -> None:
        """Record one pass: `logits` is (len(rows), num_logits, V), row i of it `rows[i]`'s."""
        index = len(self._passes)
        self._passes.append(logits)
        for position, row in enumerate(rows):
            self._where[row] = (index, position)

    def row(self, row: int) -> mx.array:
        """(num_logits, V) logits of one row."""
        index, position = self._where[row]
        return self._passes[index][position]

    def last(self, rows: Sequence[int]) -> mx.array:
        """(len(rows), V) logits after each row's last token, in the order given."""
        members: dict[int, list[int]] = {}
        for row in rows:
            index, position = self._where[row]
            members.setdefault(index, []).append(position)
        parts = []
        for index, positions in members.items():
            logits = self._passes[index]
            if positions == list(range(logits.shape[0])):
                parts.append(logits[:, -1])
            else:
                parts.append(logits[mx.array(positions), -1])
        joined = parts[0] if len(parts) == 1 else mx.concatenate(parts)
        layout = [(index, p) for index, positions in members.items() for p in positions]
        wanted = [self._where[row] for row in rows]
        if wanted == layout:
            return joined
        rank = {where: i for i, where in enumerate(layout)}
        return joined[mx.array([rank[where] for where in wanted])]


class ModelRunner:
    """Runs a language model over paged KV.

    Rows of the same length and logits count run as one batched forward pass, so no row
    is padded to another's length: decode rows batch together, verify rows of k + 1 tokens
    together, and each prefill chunk usually alone. A pass with a row that has images
    gives the model every row's `RowImages` (empty for text rows); other passes call the
    model as a text-only one.

    The engine begins each step with `start` and takes its logits with `finish`, oldest
    first. This runner computes a step in `start`'s graph, so it keeps one step in flight
    (`steps_in_flight`); a runner whose later pipeline stages work on one step while this
    rank begins the next keeps more.

    Args:
        model: the language model; its attention layers call the cache protocol, its
            state layers the state-cache protocol. Rows with images need an
            `ImageLanguageModel`.
        storage: the key/value pools the model reads and writes, with the state slots of
            a model with state layers.
        adapters: the model's unfused LoRA adapters, told each forward pass's row scales.
    """

    steps_in_flight = 1
    """How many steps the engine may have started before it must `finish` the oldest."""

    takes_pending_tokens = True
    """Whether rows may carry pending tokens (`RowInput.pending`): lazy arrays this
    runner reads on the device. A runner that sends its rows elsewhere needs host ids."""

    def __init__(
        self,
        model: LanguageModel,
        storage: PagedKVStorage,
        *,
        adapters: RowAdapterScales | None = None,
    ) -> None:
        self.model = model
        self.storage = storage
        self.adapters = adapters
        self._started: deque[StepLogits] = deque()

    @cached_property
    def layout(self) -> CacheLayout:
        """What each of the model's layers keeps (`model_cache_layout`)."""
        return model_cache_layout(self.model)

    @cached_property
    def batches_rows(self) -> bool:
        """Whether rows of different contexts share passes (`model_batches_rows`)."""
        return model_batches_rows(self.model)

    @property
    def num_started(self) -> int:
        """Steps `start` began that `finish` has not consumed yet."""
        return len(self._started)

    def start(self, rows: Sequence[RowInput]) -> None:
        """Begin a step over `rows` (as `run`); `finish` returns its logits.

        Raises:
            Exception: whatever the forward pass raises: the step did not start. A runner
                that keeps several steps in flight may have dropped some of the earlier
                ones with it, oldest first (`num_started` says how many it still holds).
        """
        self._started.append(self.run(rows))

    def finish(self) -> StepLogits:
        """The logits of the oldest step `start` began and `finish` has not returned.

        The step is consumed even when this raises (its logits are lost); later ones may
        be dropped with it, as with `start`.

        Raises:
            IndexError: no step is started.
        """
        return self._started.popleft()

    def prepare_storage(self, num_blocks: Sequence[int], copies: Sequence[BlockCopy]) -> None:
        """Grow each block group's pools to hold its `num_blocks` blocks and make the
        step's copy-on-write copies, before the step that writes them.

        Raises:
            ValueError: a count exceeds its group's `max_blocks`.
        """
        for group, count in enumerate(num_blocks):
            self.storage.ensure_capacity(count, group)
        self.storage.copy_blocks(copies)

    def execute(self, rows: Sequence[RowInput]) -> list[mx.array]:
        """Compute every row's tokens, storing their KV.

        Returns:
            Per row, in order, its (num_logits, V) logits; lazy, like the pools' writes,
            until the caller evaluates them with `storage.arrays()`.
        """
        step = self.run(rows)
        return [step.row(i) for i in range(len(rows))]

    def run(self, rows: Sequence[RowInput]) -> StepLogits:
        """Compute every row's tokens, storing their KV; the logits as the passes made them.

        Returns:
            The step's logits, lazy like `execute`'s.

        Raises:
            ValueError: the model has state layers and a row has no `state_slot`.
        """
        has_state = self.layout.has_state
        if has_state:
            self._copy_state_sources(rows)
        step = StepLogits()
        passes = pass_groups(rows, separate_fresh=has_state, one_row=not self.batches_rows)
        for members in passes:
            pass_rows = [rows[i] for i in members]
            step.add(members, self._forward(pass_tokens(pass_rows), pass_rows))
        return step

    def _copy_state_sources(self, rows: Sequence[RowInput]) -> None:
        states = self.storage.states
        if states is None:
            raise ValueError("the model has state layers but its storage holds no state slots")
        copies = []
        for row in rows:
            if row.state_slot is None:
                raise ValueError("a model with state layers needs each row's state_slot")
            if row.state_source is not None:
                copies.append((row.state_source, row.state_slot))
        states.copy_slots(copies)

    def layer_caches(
        self, rows: Sequence[RowInput]
    ) -> list[PagedLayerCache | SlotStateCache | CompositeCache]:
        """The per-layer caches of one forward pass over `rows` (rows of one length, from
        `pass_groups`), in the model's cache-list order: views of the paged storage for
        attention parts, of the rows' state slots for state parts, and a `CompositeCache`
        for a layer of several parts."""
        attention: list[PagedLayerCache] = []
        if self.layout.attention_parts:
            batches = [
                PagedBatch(
                    [BatchRow(row.block_tables[g], row.offset, len(row.token_ids)) for row in rows],
                    self.storage.block_size,
                    window=window,
                    scalar_offset=not self.batches_rows,
                )
                for g, window in enumerate(self.storage.windows)
            ]
            attention = make_layer_caches(self.storage, *batches)
        if self.layout.is_plain:
            return [*attention]
        states: list[SlotStateCache] = []
        if self.storage.states is not None:
            slots = mx.array([row.state_slot for row in rows], dtype=mx.int32)
            states = make_state_caches(
                self.storage.states, slots, fresh=all(row.offset == 0 for row in rows)
            )
        return _assemble(self.layout, attention, states)

    def _forward(self, tokens: mx.array, rows: Sequence[RowInput]) -> mx.array:
        """(B, L) tokens → (B, num_logits, V) logits of each row's last positions."""
        caches = self.layer_caches(rows)
        if self.adapters is not None:
            self.adapters.set_row_scales([row.adapter_scales or () for row in rows])
        last_only = rows[0].num_logits == 1
        if not any(row.images for row in rows):
            return self.model(tokens, caches, last_only=last_only)
        # The engine admits images only for a model with vision support.
        model = cast(ImageLanguageModel, self.model)
        images = [RowImages(row.offset, row.images) for row in rows]
        return model(tokens, caches, last_only=last_only, images=images)


def _assemble(
    layout: CacheLayout, attention: Sequence[PagedLayerCache], states: Sequence[SlotStateCache]
) -> list[PagedLayerCache | SlotStateCache | CompositeCache]:
    """The layout's layers, each its part's view or a `CompositeCache` of its parts."""
    next_attention, next_state = iter(attention), iter(states)
    caches: list[PagedLayerCache | SlotStateCache | CompositeCache] = []
    for parts in layout.layers:
        views = [next(next_attention) if part.stores_kv else next(next_state) for part in parts]
        caches.append(views[0] if len(views) == 1 else CompositeCache(views))
    return caches
