"""One layer's view of the paged cache during a forward pass: writes, context reads, masks
and attention, through the gather or a decode kernel reading the pools."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import mlx.core as mx

from mlxcel_core.cache.paged.batch import LengthGroup, PagedBatch
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
    cpu_decode_attention,
    decode_kernel_backend,
    paged_decode_attention_kernel,
    serves_on_cpu,
    turbo_decode_attention_kernel,
    turbo_decode_kernel_backend,
)

# The layer caches whose last `update_and_fetch` returned only the new positions, by the id
# of the keys they returned (`deferred_context_owner`).
_DEFERRED_CONTEXTS: weakref.WeakValueDictionary[int, PagedLayerCache] = (
    weakref.WeakValueDictionary()
)


def deferred_context_owner(keys: mx.array, values: mx.array) -> PagedLayerCache | None:
    """The layer cache whose `update_and_fetch` returned `keys` and `values` as the new
    positions alone, or None: a layer that attends over another layer's keys and values
    without a cache of its own (Gemma 4's KV-shared layers, which mlx-lm hands the
    earlier layer's `update_and_fetch` result) attends through that cache."""
    owner = _DEFERRED_CONTEXTS.get(id(keys))
    if owner is None or owner._returned is None or owner._context_fetched:
        return None
    returned_keys, returned_values = owner._returned
    return owner if returned_keys is keys and returned_values is values else None


class PagedLayerCache:
    """One layer's view of the paged cache during one forward pass (the `KVCache` and
    `AttentionCache` protocols).

    `offset` is a (B,) int32 array, which RoPE applies per row (an int in a batch made with
    `scalar_offset`); `update_and_fetch` stores the new keys and values in their slots,
    then returns each row's whole context. In a decode pass of a layer in the storage's
    `layers_attending_in_cache` it returns only the new positions instead, and
    `attention` gathers the context if no kernel reads the pools: gathering a quantized
    context builds a graph of some thirty operations per layer, host time that a decode
    kernel reading the codes would otherwise pay every step for nothing.
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
            self._anchors(),
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
            _DEFERRED_CONTEXTS[id(keys)] = self
        else:
            self._returned = self._fetch_context()
        return self._returned

    def _fetch_context(self) -> tuple[mx.array, mx.array]:
        residual = self._residual
        keys, values = self._storage.gather(
            self._layer,
            self._batch.read_slots,
            self._anchors(),
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

    def _anchors(self) -> RowAnchors | None:
        """The batch's anchors where this layer's keys are centered; None spares building
        them."""
        return self._batch.anchors if self._storage.centers_keys(self._layer) else None

    def keys_and_values(self) -> tuple[mx.array, mx.array]:
        """Each row's context after this pass's `update_and_fetch` (the window's, in a
        windowed group), for layers that attend over another layer's keys and values
        (mlx-lm's KV-sharing families)."""
        if self._context_fetched and self._returned is not None:
            return self._returned
        return self._fetch_context()

    def make_mask(
        self, num_queries: int, *, return_array: bool = False, window_size: int | None = None
    ) -> AttentionMask:
        batch = self._batch
        if (
            batch.num_rows == 1
            and batch.window is None
            and window_size is None
            and not return_array
        ):
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
        queries' dtype, float32 ones on the CPU by its C kernel, or TurboQuant keys and
        values), several queries of a row as rows of their own (`attend_per_query`); any
        other pass attends to the gathered keys and values with
        `mx.fast.scaled_dot_product_attention`; a one-row pass of several
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
        """The context of the layer of this pass whose `update_and_fetch` returned `keys`
        and `values` (perhaps its new positions only), where a model attends over another
        layer's keys through this layer (IQuest-Loop-Coder's second loop, in a window
        group, attends over the first loop's full-attention keys under the first loop's
        mask); None where no layer returned them."""
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
        pools alone, so not where exact copies stand in for some positions, and read
        each row from its first position, so not for a windowed group's batch."""
        batch = self._batch
        causal = mask is None or mask is batch.mask()
        one_row_causal = isinstance(mask, str) and mask == "causal" and batch.num_rows == 1
        return (
            self._storage.decode_kernel
            and batch.window is None
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
        """Decode attention by the device's kernel, or on the CPU by its C kernel, over
        unquantized pools of the queries' dtype; None where neither serves them."""
        storage = self._storage
        _, H_q, _, D = queries.shape
        key_pool, value_pool = storage.keys[self._layer][0], storage.values[self._layer][0]
        if key_pool.dtype != queries.dtype:
            return None
        backend = decode_kernel_backend(
            mx.default_device(), key_pool.dtype, H_q, key_pool.shape[1], D, value_pool.shape[2]
        )
        if backend is not None:
            return self._per_query(
                queries,
                lambda rows, tables, lengths: paged_decode_attention_kernel(
                    rows, key_pool, value_pool, tables, lengths,
                    block_size=storage.block_size, scale=scale, backend=backend,
                ),
            )  # fmt: skip
        if not serves_on_cpu(queries, key_pool, value_pool):
            return None
        return self._per_query(
            queries,
            lambda rows, tables, lengths: cpu_decode_attention(
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
        backend = turbo_decode_kernel_backend(
            mx.default_device(),
            queries.shape[1],
            geometry.num_kv_heads,
            geometry.key_dim,
            geometry.value_dim,
            key_codec.bits,
            value_codec.bits,
        )
        if backend is None:
            return None
        keys = _turbo_pool(storage.keys[self._layer], key_codec)
        values = _turbo_pool(storage.values[self._layer], value_codec)
        return self._per_query(
            queries,
            lambda rows, tables, lengths: turbo_decode_attention_kernel(
                rows, keys, values, key_codec.rotation, key_codec.signs, tables, lengths,
                block_size=storage.block_size, scale=scale, backend=backend,
            ),
        )  # fmt: skip


def _turbo_pool(pool: Sequence[mx.array], codec: TurboQuantCodec) -> TurboPool:
    codes, scales, positions, outliers = pool
    return TurboPool(codes, scales, positions, outliers, codec.levels, codec.bits)


def make_layer_caches(storage: PagedKVStorage, *batches: PagedBatch) -> list[PagedLayerCache]:
    """One view per layer, for the model's `cache` argument, each over its block group's
    batch (`batches`: one per group of the storage, in group order, each made from the
    rows' tables of that group with the group's window); plans the pass's residual
    blocks, so call it once per pass, in the order the passes write.

    Raises:
        ValueError: there is not one batch per group.
    """
    if len(batches) != len(storage.windows):
        raise ValueError(f"one batch per block group ({len(storage.windows)}), got {len(batches)}")
    residual = [batch.residual_slots(storage, group) for group, batch in enumerate(batches)]
    caches: list[PagedLayerCache] = []
    caches.extend(
        PagedLayerCache(storage, layer, batches[group], residual[group], siblings=caches)
        for layer, group in enumerate(storage.layer_groups)
    )
    return caches
