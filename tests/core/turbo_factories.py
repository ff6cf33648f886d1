"""TurboQuant pools written as a prefill would write them, and decode attention over them,
for the kernel tests (CUDA, Metal, and the Metal sources run on the CPU)."""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import numpy as np

from mlxcel_core.cache.paged import BatchRow, LayerGeometry, PagedBatch, PagedKVStorage
from mlxcel_core.cache.paged.layer_cache import PagedLayerCache
from mlxcel_core.kernels.paged_attention import TurboPool


def written_storage(
    lengths: list[int],
    *,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    key_type: str,
    value_type: str,
    dtype: mx.Dtype,
    seed: int,
    device: mx.Device | None = None,
) -> tuple[PagedKVStorage, list[list[int]]]:
    """A storage holding rows of `lengths` positions written in one prefill pass on
    `device` (the default one if None); keys share a large mean per head and carry one
    large feature, as real keys do. Returns it and each row's block table."""
    rng = np.random.default_rng(seed)
    blocks_per_row = [-(-n // block_size) for n in lengths]
    ids = rng.permutation(np.arange(1, 1 + sum(blocks_per_row))).tolist()
    tables, start = [], 0
    for count in blocks_per_row:
        tables.append(ids[start : start + count])
        start += count
    geometry = LayerGeometry(num_kv_heads, head_dim, head_dim, dtype)
    storage = PagedKVStorage(
        [geometry],
        block_size,
        max_blocks=1 + len(ids),
        cache_type_k=key_type,
        cache_type_v=value_type,
    )
    storage.ensure_capacity(1 + len(ids))
    prefill = PagedBatch(
        [BatchRow(table, 0, n) for table, n in zip(tables, lengths, strict=True)], block_size
    )
    shape = (len(lengths), prefill.num_queries, num_kv_heads, head_dim)
    mean = 3.0 * rng.standard_normal((1, 1, num_kv_heads, head_dim))
    keys = mean + rng.standard_normal(shape)
    keys[..., 5] += 8.0
    values = rng.standard_normal(shape)
    flat = (-1, num_kv_heads, head_dim)
    with mx.stream(device or mx.default_device()):
        storage.write(
            0,
            prefill.write_slots,
            mx.array(keys.reshape(flat).astype(np.float32)).astype(dtype),
            mx.array(values.reshape(flat).astype(np.float32)).astype(dtype),
            prefill.anchors,
        )
        mx.eval(storage.arrays())
    return storage, tables


def decode_batch(tables: list[list[int]], lengths: list[int], block_size: int) -> PagedBatch:
    rows = [BatchRow(table, n - 1, 1) for table, n in zip(tables, lengths, strict=True)]
    return PagedBatch(rows, block_size)


def gather_then_attend(
    storage: PagedKVStorage, batch: PagedBatch, queries: mx.array, scale: float
) -> mx.array:
    keys, values = storage.gather(0, batch.read_slots, batch.anchors)
    return mx.fast.scaled_dot_product_attention(
        queries, keys, values, scale=scale, mask=batch.mask()
    )


def turbo_pools(storage: PagedKVStorage) -> tuple[TurboPool, TurboPool]:
    """Layer 0's key and value pools as the TurboQuant kernels take them."""
    key_codec, value_codec = storage.codecs(0)
    return (
        TurboPool(*storage.keys[0], key_codec.levels, key_codec.bits),
        TurboPool(*storage.values[0], value_codec.levels, value_codec.bits),
    )


def attend_from_storage(
    attend: Callable[..., mx.array],
    storage: PagedKVStorage,
    batch: PagedBatch,
    queries: mx.array,
    *,
    scale: float,
    num_partitions: int | None,
) -> mx.array:
    """`attend` (a TurboQuant decode attention function) over layer 0's pools."""
    key_codec, _ = storage.codecs(0)
    keys, values = turbo_pools(storage)
    return attend(
        queries,
        keys,
        values,
        key_codec.rotation,
        key_codec.signs,
        batch.block_tables,
        batch.context_lengths,
        block_size=storage.block_size,
        scale=scale,
        num_partitions=num_partitions,
    )


# Rows' cached positions, and the new tokens each verifies: a row with fewer than the
# pass's most has padding queries, whose outputs must still be the gather path's.
VERIFIED_LENGTHS = [30, 13, 45]
VERIFIED_TOKENS = [2, 1, 2]


def verification(cache_type: str, *, decode_kernel: bool, seed: int, device: mx.Device) -> mx.array:
    """One pass of `VERIFIED_TOKENS` queries per row after `VERIFIED_LENGTHS` positions
    through the layer cache of a storage of `cache_type` pools on `device`, as the model's
    attention calls it; with `decode_kernel`, the layer is one whose attention has come
    through the cache, so the context is left to `attention`, as the engine's passes do."""
    storage, tables = written_storage(
        VERIFIED_LENGTHS, num_kv_heads=2, head_dim=32, block_size=16, key_type=cache_type,
        value_type=cache_type, dtype=mx.float32, seed=seed, device=device,
    )  # fmt: skip
    storage.decode_kernel = decode_kernel
    storage.layers_attending_in_cache.add(0)
    rows = [
        BatchRow(table, length, n)
        for table, length, n in zip(tables, VERIFIED_LENGTHS, VERIFIED_TOKENS, strict=True)
    ]
    batch = PagedBatch(rows, 16)
    cache = PagedLayerCache(storage, 0, batch)
    rng = np.random.default_rng(seed + 1)
    L = batch.num_queries
    new_keys, new_values = (
        mx.array(rng.standard_normal((3, 2, L, 32)).astype(np.float32)) for _ in range(2)
    )
    queries = mx.array(rng.standard_normal((3, 8, L, 32)).astype(np.float32))
    with mx.stream(device):
        keys, values = cache.update_and_fetch(new_keys, new_values)
        if decode_kernel:
            assert keys.shape[2] == L  # the context was left to attention
        return cache.attention(queries, keys, values, scale=0.2, mask=cache.make_mask(L))
