"""One forward pass over paged KV: the batch's slot tables, masks and per-layer cache views."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlxcel_core.cache.paged.centering import RowAnchors
from mlxcel_core.cache.paged.prefill_lengths import (
    causal_attention_at_rounded_length,
    rounds_prefill_lengths,
)
from mlxcel_core.cache.paged.residual import ResidualSlots
from mlxcel_core.cache.paged.storage import PagedKVStorage
from mlxcel_core.cache.protocol import AttentionMask
from mlxcel_core.cache.quant.turbo import TurboQuantCodec
from mlxcel_core.kernels.paged_attention import (
    MAX_QUERIES_PER_ROW,
    TurboPool,
    attend_per_query,
    paged_decode_attention,
    turbo_decode_attention_cuda,
    uses_decode_kernel,
    uses_turbo_decode_kernel,
)


@dataclass(frozen=True)
class BatchRow:
    """One sequence's part of a forward pass.

    Attributes:
        block_table: the sequence's block ids in position order, covering at least
            `offset + num_new_tokens` positions.
        offset: positions already in the cache (tokens).
        num_new_tokens: positions this pass computes and stores (>= 1).
    """

    block_table: Sequence[int]
    offset: int
    num_new_tokens: int


@dataclass(frozen=True)
class LengthGroup:
    """Rows of a decode pass that attend together, padded to the longest of them only.

    Attributes:
        rows: (G,) int32 rows of the batch, longest first.
        read_slots: (G, S_g) int32 slots of their keys, S_g the longest row's length.
        anchors: their first blocks, for reading centered pools.
        mask: (G, 1, 1, S_g) bool, True where a row has a key.
    """

    rows: mx.array
    read_slots: mx.array
    anchors: RowAnchors
    mask: mx.array


# Below this, the keys a row would skip in a group of its own cost less to read on the CPU
# than the group's extra operations in every layer (docs/paged-attention.md).
MIN_SKIPPED_KEYS = 64


def _pad_block_tables(tables: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(rows, longest table) int32 block ids, each row padded with -1; (rows,) table lengths."""
    counts = np.fromiter((len(table) for table in tables), np.int64, len(tables))
    padded = np.full((len(tables), max(int(counts.max()), 1)), -1, dtype=np.int32)
    flat = np.fromiter(itertools.chain.from_iterable(tables), np.int32, int(counts.sum()))
    padded[np.arange(padded.shape[1]) < counts[:, None]] = flat
    return padded, counts


def _anchor_positions(block_size: int) -> np.ndarray:
    """Positions of a row's first block whose mean its later positions are stored against:
    all but position 0, the attention sink whose key is unlike the others (Xiao et al.,
    "Efficient Streaming Language Models with Attention Sinks", 2023), unless it is alone."""
    return np.arange(min(1, block_size - 1), block_size, dtype=np.int32)


class PagedBatch:
    """Slot tables and masks of a batch of rows, each padded to the longest row.

    Row b's new tokens sit at positions offset_b .. offset_b + n_b - 1; the batch has
    L = max n_b query positions per row and S = max(offset_b + n_b) key positions. Padding
    queries write to the null block and padding keys are masked out.

    Args:
        rows: the rows, at least one.
        block_size: tokens per block.
        scalar_offset: the layers' caches give `offset` as an int (one row only), for
            models that read it as one integer.

    Raises:
        ValueError: `rows` is empty, a row's block table is too short, or
            `scalar_offset` is asked of several rows.
    """

    def __init__(
        self, rows: Sequence[BatchRow], block_size: int, *, scalar_offset: bool = False
    ) -> None:
        if not rows:
            raise ValueError("rows must hold at least one row")
        if scalar_offset and len(rows) != 1:
            raise ValueError(f"scalar_offset needs one row, got {len(rows)}")
        self.scalar_offset = rows[0].offset if scalar_offset else None
        self.num_rows = len(rows)
        self.num_queries = max(row.num_new_tokens for row in rows)
        self.num_keys = max(row.offset + row.num_new_tokens for row in rows)
        offsets = np.fromiter((row.offset for row in rows), np.int32, self.num_rows)
        lengths = offsets + np.fromiter(
            (row.num_new_tokens for row in rows), np.int32, self.num_rows
        )
        tables, num_blocks = _pad_block_tables([row.block_table for row in rows])
        covered = num_blocks * block_size
        short = np.flatnonzero(covered < lengths)
        if short.size:
            b = int(short[0])
            raise ValueError(
                f"row {b}'s block table covers {int(covered[b])} positions; it needs {lengths[b]}"
            )
        key_positions = np.arange(self.num_keys, dtype=np.int32)
        block_of = np.minimum(key_positions // block_size, tables.shape[1] - 1)
        slots = tables[:, block_of] * block_size + key_positions % block_size
        read = np.where(key_positions < lengths[:, None], slots, 0).astype(np.int32)
        query_positions = offsets[:, None] + np.arange(self.num_queries, dtype=np.int32)
        is_real_query = query_positions < lengths[:, None]
        # Padding queries all write to slot 0, inside the null block.
        last_positions = np.minimum(query_positions, lengths[:, None] - 1)
        write = np.where(is_real_query, np.take_along_axis(read, last_positions, 1), 0)
        self.offsets = mx.array(offsets)
        # Decode attention reads the pools through these; -1 padding reads block 0.
        self.block_tables = mx.array(np.maximum(tables, 0))
        self.context_lengths = mx.array(lengths)
        self.read_slots = mx.array(read)
        self.write_slots = mx.array(write.reshape(-1))
        write_centered = (is_real_query & (query_positions >= block_size)).reshape(-1)
        self.anchors = RowAnchors(
            anchor_slots=mx.array(tables[:, :1] * block_size + _anchor_positions(block_size)),
            write_rows=mx.array(
                np.repeat(np.arange(self.num_rows, dtype=np.int32), self.num_queries)
            ),
            write_centered=mx.array(write_centered),
            read_centered=mx.array(
                (key_positions >= block_size) & (key_positions < lengths[:, None])
            ),
            writes_first_blocks=bool((is_real_query & (query_positions < block_size)).any()),
            writes_past_first_blocks=bool(write_centered.any()),
        )
        self._block_size = block_size
        self._tables = tables
        self._offsets = offsets
        self._query_positions = query_positions
        self._lengths = lengths
        self._masks: dict[int | None, mx.array] = {}
        self._query_tables: tuple[mx.array, mx.array] | None = None
        self._length_groups: tuple[list[LengthGroup], mx.array] | None = None
        self._length_groups_found = False

    def mask(self, window_size: int | None = None) -> mx.array:
        """(B, 1, L, S) boolean mask; True where a query may attend to a key.

        Query i of row b (position offset_b + i) sees the row's keys at positions up to its
        own, and with `window_size` only the last `window_size` of them.
        """
        if window_size not in self._masks:
            keys = np.arange(self.num_keys, dtype=np.int32)[None, None, :]
            queries = np.minimum(self._query_positions, self._lengths[:, None] - 1)[:, :, None]
            allowed = keys <= queries
            if window_size is not None:
                allowed &= keys > queries - window_size
            self._masks[window_size] = mx.array(allowed[:, None])
        return self._masks[window_size]

    def query_tables(self) -> tuple[mx.array, mx.array]:
        """Each query as a row of its own, for decode kernels that take one query per row
        (`attend_per_query`): its row's block table, (B * L, max_blocks) int32, and the
        positions it attends to, (B * L,) int32 (those `mask()` lets it see: up to its
        own, or up to its row's last for a padding query). Found once per pass."""
        if self._query_tables is None:
            seen = np.minimum(self._query_positions, self._lengths[:, None] - 1) + 1
            tables = np.repeat(np.maximum(self._tables, 0), self.num_queries, axis=0)
            self._query_tables = (mx.array(tables), mx.array(seen.reshape(-1)))
        return self._query_tables

    def residual_slots(self, storage: PagedKVStorage) -> ResidualSlots | None:
        """Plan the storage's residual blocks for this pass (`PagedKVStorage.plan_residual`);
        None when it keeps none."""
        return storage.plan_residual(self._tables, self._offsets, self._lengths)

    def length_groups(self) -> tuple[list[LengthGroup], mx.array] | None:
        """A decode pass's rows in groups by context length, and the (B,) int32 order that
        puts the groups' rows, concatenated, back in batch order; None when one group would
        hold them all (or the pass is not a decode pass). Found once per pass.

        Rows are taken longest first; a row starts a new group when it is no longer than
        half the current group's longest and at least `MIN_SKIPPED_KEYS` shorter. So a
        short row beside a long one does not read, and attend over, the long one's
        padding: a row is padded to about twice its length at most, or to fewer than
        `MIN_SKIPPED_KEYS` keys past it, whichever is more. No group is made to skip only
        a few keys, since each group repeats the gather's operations in every layer.
        """
        if not self._length_groups_found:
            self._length_groups_found = True
            self._length_groups = self._find_length_groups()
        return self._length_groups

    def _find_length_groups(self) -> tuple[list[LengthGroup], mx.array] | None:
        if self.num_queries != 1 or self.num_rows == 1:
            return None
        order = np.argsort(-self._lengths, kind="stable")
        starts = [0]
        for i in range(1, len(order)):
            length, longest = self._lengths[order[i]], self._lengths[order[starts[-1]]]
            if 2 * length <= longest and longest - length >= MIN_SKIPPED_KEYS:
                starts.append(i)
        if len(starts) == 1:
            return None
        groups = [
            self._length_group(order[start:end])
            for start, end in zip(starts, [*starts[1:], len(order)], strict=True)
        ]
        return groups, mx.array(np.argsort(order).astype(np.int32))

    def _length_group(self, rows: np.ndarray) -> LengthGroup:
        num_keys = int(self._lengths[rows[0]])
        selected = mx.array(rows.astype(np.int32))
        # One new position per row: the group's written positions are its rows'.
        written = self._query_positions[rows, 0]
        centered = written >= self._block_size
        return LengthGroup(
            rows=selected,
            read_slots=self.read_slots[selected, :num_keys],
            anchors=RowAnchors(
                anchor_slots=self.anchors.anchor_slots[selected],
                write_rows=mx.arange(len(rows), dtype=mx.int32),
                write_centered=mx.array(centered),
                read_centered=self.anchors.read_centered[selected, :num_keys],
                writes_first_blocks=bool((~centered).any()),
                writes_past_first_blocks=bool(centered.any()),
            ),
            mask=self.mask()[selected, :, :, :num_keys],
        )


class PagedLayerCache:
    """One layer's view of the paged cache during one forward pass (the `KVCache` and
    `AttentionCache` protocols).

    `offset` is a (B,) int32 array, which RoPE applies per row (an int in a batch made with
    `scalar_offset`); `update_and_fetch` stores the
    new keys and values in their slots, then returns each row's whole context. In a decode
    pass of a layer in the storage's `layers_attending_in_cache` it returns only the new
    positions instead, and `attention` gathers the context if no kernel reads the pools:
    gathering a quantized context builds a graph of some thirty operations per layer,
    host time that a decode kernel reading the codes would otherwise pay every step for
    nothing.
    """

    def __init__(
        self,
        storage: PagedKVStorage,
        layer: int,
        batch: PagedBatch,
        residual: ResidualSlots | None = None,
        *,
        siblings: Sequence[PagedLayerCache] = (),
    ) -> None:
        self._storage = storage
        self._siblings = siblings
        self._layer = layer
        self._batch = batch
        self._residual = residual
        self._new_kv: tuple[mx.array, mx.array] | None = None
        self._returned: tuple[mx.array, mx.array] | None = None
        self._context_fetched = True

    @property
    def offset(self) -> mx.array | int:
        batch = self._batch
        return batch.offsets if batch.scalar_offset is None else batch.scalar_offset

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        B, H, L, _ = keys.shape
        self._storage.write(
            self._layer,
            self._batch.write_slots,
            keys.transpose(0, 2, 1, 3).reshape(B * L, H, -1),
            values.transpose(0, 2, 1, 3).reshape(B * L, H, -1),
            self._batch.anchors,
            None if self._residual is None else self._residual.write_slots,
        )
        if self._residual is not None and L > 1:
            self._new_kv = (keys, values)
        if (
            self._batch.num_queries <= MAX_QUERIES_PER_ROW
            and self._layer in self._storage.layers_attending_in_cache
        ):
            self._context_fetched = False
            self._returned = (keys, values)
        else:
            self._returned = self._fetch_context()
        return self._returned

    def _fetch_context(self) -> tuple[mx.array, mx.array]:
        residual = self._residual
        keys, values = self._storage.gather(
            self._layer,
            self._batch.read_slots,
            self._batch.anchors,
            None if residual is None else (residual.read_slots, residual.exact),
        )
        if residual is not None and self._new_kv is not None:
            new_keys, new_values = self._new_kv
            exact_keys, exact_values = self._storage.exact_sides
            if exact_keys:
                keys = residual.with_new_positions(keys, new_keys)
            if exact_values:
                values = residual.with_new_positions(values, new_values)
        return keys, values

    def keys_and_values(self) -> tuple[mx.array, mx.array]:
        """Each row's whole context after this pass's `update_and_fetch`, for layers that
        attend over another layer's keys and values (mlx-lm's KV-sharing families)."""
        if self._context_fetched and self._returned is not None:
            return self._returned
        return self._fetch_context()

    def make_mask(
        self, num_queries: int, *, return_array: bool = False, window_size: int | None = None
    ) -> AttentionMask:
        batch = self._batch
        if batch.num_rows == 1 and window_size is None and not return_array:
            # One row has no padding: the plain causal mask (None for one query) is exact
            # and lets attention take its fastest path.
            return "causal" if num_queries > 1 else None
        return batch.mask(window_size)

    def trim(self, num_tokens: int) -> int:
        """Paged views never drop positions; sequences shrink through the KV manager."""
        return 0

    def attention(
        self,
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        *,
        scale: float,
        mask: AttentionMask,
    ) -> mx.array | None:
        """Attention of this pass's queries over the layer's context; None where `keys`
        or `values` are not what `update_and_fetch` returned (`AttentionCache`).

        A pass of up to `MAX_QUERIES_PER_ROW` queries per row (decode; a speculative
        verification; a short prefill chunk) under the batch's own unwindowed causal mask
        reads the pools through the block tables when a kernel serves the device and the
        pools' types (`mlxcel_core.kernels.paged_attention`: unquantized pools of the
        queries' dtype, or TurboQuant keys and values), several queries of a row as rows
        of their own (`attend_per_query`); any other pass attends to the gathered keys
        and values with `mx.fast.scaled_dot_product_attention`; a one-row pass of several
        queries (a prefill chunk, or a speculative verification) that CUDA would send to
        cuDNN attends at a rounded query count (`prefill_lengths`).

        Args:
            queries: (B, H_q, L, D_k), H_q a multiple of H_kv.
            keys: (B, H_kv, S, D_k), as `update_and_fetch` returned them (the new
                positions alone when it left the context unfetched).
            values: (B, H_kv, S, D_v), likewise.
            scale: multiplier of the query-key dot products.
            mask: the mask `make_mask` gave the model.

        Returns:
            (B, H_q, L, D_v) in the queries' dtype, or None.
        """
        returned = self._returned
        if returned is None or keys is not returned[0] or values is not returned[1]:
            context = self._sibling_context(keys, values)
            if context is None:
                return None
            return mx.fast.scaled_dot_product_attention(queries, *context, scale=scale, mask=mask)
        self._storage.layers_attending_in_cache.add(self._layer)
        if self._decodes_from_pools(mask):
            attended = self._attend_from_pools(queries, scale)
            if attended is not None:
                return attended
        if not self._context_fetched:
            groups = self._batch.length_groups() if self._groups_by_length(mask) else None
            if groups is not None:
                return self._attend_by_length(queries, scale, *groups)
            keys, values = self._fetch_context()
        if (
            isinstance(mask, str)
            and queries.shape[2] > 1
            and rounds_prefill_lengths(queries, values)
        ):
            return causal_attention_at_rounded_length(queries, keys, values, scale=scale)
        return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)

    def _sibling_context(
        self, keys: mx.array, values: mx.array
    ) -> tuple[mx.array, mx.array] | None:
        """The whole context of the layer of this pass whose `update_and_fetch` returned
        `keys` and `values` (perhaps its new positions only), where a model attends over
        another layer's keys through this layer (IQuest-Loop-Coder's second loop attends
        over the first loop's); None where no layer returned them."""
        for cache in self._siblings:
            returned = cache._returned
            if returned is not None and keys is returned[0] and values is returned[1]:
                return cache.keys_and_values()
        return None

    def _groups_by_length(self, mask: AttentionMask) -> bool:
        """Attend by length groups: on the CPU, where they were measured to pay (a GPU
        pays a launch per operation that a group adds), under the batch's own mask."""
        return (
            mask is not None
            and mx.default_device().type == mx.DeviceType.cpu
            and mask is self._batch.mask()
        )

    def _attend_by_length(
        self, queries: mx.array, scale: float, groups: Sequence[LengthGroup], order: mx.array
    ) -> mx.array:
        """Decode attention group by group (`PagedBatch.length_groups`), each group's
        context gathered to its own longest row."""
        residual = self._residual
        outputs = []
        for group in groups:
            exact = None
            if residual is not None:
                exact = residual.rows(group.rows, group.read_slots.shape[1])
            keys, values = self._storage.gather(self._layer, group.read_slots, group.anchors, exact)
            outputs.append(
                mx.fast.scaled_dot_product_attention(
                    queries[group.rows], keys, values, scale=scale, mask=group.mask
                )
            )
        return mx.concatenate(outputs)[order]

    def _decodes_from_pools(self, mask: AttentionMask) -> bool:
        """A pass of few queries per row under the batch's own unwindowed causal mask (one
        row's plain "causal" one included), with kernels allowed: the kernels read the
        pools alone, so not where exact copies stand in for some positions."""
        batch = self._batch
        causal = mask is None or mask is batch.mask()
        one_row_causal = isinstance(mask, str) and mask == "causal" and batch.num_rows == 1
        return (
            self._storage.decode_kernel
            and self._residual is None
            and batch.num_queries <= MAX_QUERIES_PER_ROW
            and (causal or one_row_causal)
        )

    def _per_query(
        self, queries: mx.array, attend: Callable[[mx.array, mx.array, mx.array], mx.array]
    ) -> mx.array:
        """`attend(queries, block_tables, context_lengths)` over the batch's rows, or over
        each query as a row of its own when rows have several."""
        batch = self._batch
        if queries.shape[2] == 1:
            return attend(queries, batch.block_tables, batch.context_lengths)
        return attend_per_query(attend, queries, *batch.query_tables())

    def _attend_from_pools(self, queries: mx.array, scale: float) -> mx.array | None:
        """Decode attention by a kernel reading this layer's pools, or None where no kernel
        serves the pools' types on the default device."""
        key_codec, value_codec = self._storage.codecs(self._layer)
        if key_codec is None and value_codec is None:
            return self._attend_from_float_pools(queries, scale)
        if isinstance(key_codec, TurboQuantCodec) and isinstance(value_codec, TurboQuantCodec):
            return self._attend_from_turbo_pools(queries, scale, key_codec, value_codec)
        return None

    def _attend_from_float_pools(self, queries: mx.array, scale: float) -> mx.array | None:
        storage = self._storage
        _, H_q, _, D = queries.shape
        key_pool, value_pool = storage.keys[self._layer][0], storage.values[self._layer][0]
        if key_pool.dtype != queries.dtype or not uses_decode_kernel(
            mx.default_device(), key_pool.dtype, H_q, key_pool.shape[1], D, value_pool.shape[2]
        ):
            return None
        return self._per_query(
            queries,
            lambda rows, tables, lengths: paged_decode_attention(
                rows, key_pool, value_pool, tables, lengths,
                block_size=storage.block_size, scale=scale,
            ),
        )  # fmt: skip

    def _attend_from_turbo_pools(
        self,
        queries: mx.array,
        scale: float,
        key_codec: TurboQuantCodec,
        value_codec: TurboQuantCodec,
    ) -> mx.array | None:
        storage = self._storage
        geometry = storage.layers[self._layer]
        if not uses_turbo_decode_kernel(
            mx.default_device(),
            queries.shape[1],
            geometry.num_kv_heads,
            geometry.key_dim,
            geometry.value_dim,
            key_codec.bits,
            value_codec.bits,
        ):
            return None
        keys = _turbo_pool(storage.keys[self._layer], key_codec)
        values = _turbo_pool(storage.values[self._layer], value_codec)
        return self._per_query(
            queries,
            lambda rows, tables, lengths: turbo_decode_attention_cuda(
                rows, keys, values, key_codec.rotation, key_codec.signs, tables, lengths,
                block_size=storage.block_size, scale=scale,
            ),
        )  # fmt: skip


def _turbo_pool(pool: Sequence[mx.array], codec: TurboQuantCodec) -> TurboPool:
    codes, scales, positions, outliers = pool
    return TurboPool(codes, scales, positions, outliers, codec.levels, codec.bits)


def make_layer_caches(storage: PagedKVStorage, batch: PagedBatch) -> list[PagedLayerCache]:
    """One view per layer, for the model's `cache` argument; plans the pass's residual
    blocks, so call it once per pass, in the order the passes write."""
    residual = batch.residual_slots(storage)
    caches: list[PagedLayerCache] = []
    caches.extend(
        PagedLayerCache(storage, layer, batch, residual, siblings=caches)
        for layer in range(len(storage.layers))
    )
    return caches
