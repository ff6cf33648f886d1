"""KV blocks' contents as one flat array, the form they travel in between ranks.

`PagedKVStorage.read_blocks` gives one array per pool (every layer's keys, then every
layer's values); a transfer sends them as one concatenated 1-D array of the pools' common
dtype, so a prompt's KV is one `mx.distributed` send, whatever the number of layers. The
receiver knows the block count it asked for, so it can rebuild the shapes without a header.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from mlxcel_core.cache.paged import PagedKVStorage


@dataclass(frozen=True)
class BlockLayout:
    """The shape of one block's contents in a storage.

    Attributes:
        slot_shapes: per pool array, in `PagedKVStorage.arrays()` order, the (H_kv, W)
            shape of one position.
        block_size: positions per block.
        dtype: the dtype every pool array stores.
    """

    slot_shapes: tuple[tuple[int, ...], ...]
    block_size: int
    dtype: mx.Dtype

    def shapes(self, num_blocks: int) -> list[tuple[int, ...]]:
        """Each pool array's contents for `num_blocks` blocks: (num_blocks * block_size, H, W)."""
        return [(num_blocks * self.block_size, *shape) for shape in self.slot_shapes]

    def num_elements(self, num_blocks: int) -> int:
        """Elements of the flat array carrying `num_blocks` blocks."""
        return sum(math.prod(shape) for shape in self.shapes(num_blocks))


def block_layout(storage: PagedKVStorage) -> BlockLayout:
    """The block layout of `storage`.

    Raises:
        ValueError: the pools do not share one dtype (a quantized cache type stores codes
            and scales in different dtypes).
    """
    arrays = storage.arrays()
    dtypes = {array.dtype for array in arrays}
    if len(dtypes) != 1:
        names = ", ".join(sorted(str(dtype) for dtype in dtypes))
        raise ValueError(f"KV transfer needs pools of one dtype, got {names}")
    return BlockLayout(
        tuple(tuple(array.shape[1:]) for array in arrays), storage.block_size, dtypes.pop()
    )


def pack_blocks(contents: Sequence[mx.array]) -> mx.array:
    """`read_blocks`' arrays as one lazy 1-D array, pool after pool.

    Raises:
        ValueError: `contents` is empty or its arrays differ in dtype.
    """
    if not contents:
        raise ValueError("contents must hold at least one array")
    if len({array.dtype for array in contents}) != 1:
        raise ValueError("contents must share one dtype")
    return mx.concatenate([array.reshape(-1) for array in contents])


def unpack_blocks(flat: mx.array, layout: BlockLayout, num_blocks: int) -> list[mx.array]:
    """The arrays `pack_blocks` joined into `flat`, for `num_blocks` blocks of `layout`.

    Raises:
        ValueError: `flat` has another size or dtype than `layout` gives.
    """
    if flat.dtype != layout.dtype or flat.size != layout.num_elements(num_blocks):
        raise ValueError(
            f"expected {layout.num_elements(num_blocks)} {layout.dtype} elements for "
            f"{num_blocks} blocks, got {flat.size} {flat.dtype}"
        )
    arrays, start = [], 0
    for shape in layout.shapes(num_blocks):
        size = math.prod(shape)
        arrays.append(flat[start : start + size].reshape(shape))
        start += size
    return arrays
