"""The arrays behind a paged KV cache: one key pool and one value pool per layer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from mlxcel_core.cache.paged.manager import BlockCopy

# Pools grow by at least half their size, so growing to N blocks copies O(N) in total.
_GROWTH_FACTOR = 1.5
_MIN_GROWTH_BLOCKS = 16


@dataclass(frozen=True)
class LayerGeometry:
    """The shape of one attention layer's keys and values.

    Attributes:
        num_kv_heads: key/value heads (H_kv).
        key_dim: features per key head (D_k).
        value_dim: features per value head (D_v).
        dtype: the dtype the layer produces keys and values in.
    """

    num_kv_heads: int
    key_dim: int
    value_dim: int
    dtype: mx.Dtype

    @property
    def bytes_per_token(self) -> int:
        """Key plus value bytes one position takes in this layer."""
        return self.num_kv_heads * (self.key_dim + self.value_dim) * self.dtype.size


class PagedKVStorage:
    """Key and value pools of `block_size`-token blocks, grown as blocks are materialized.

    Layer l's keys live in one array of shape (capacity * block_size, H_kv, D_k): position
    p of block b is slot `b * block_size + p`. Block 0 is the null block: padding writes land
    there and nothing reads it unmasked.

    Args:
        layers: the geometry of each attention layer, in model order.
        block_size: tokens per block.
        max_blocks: the most blocks the pools may ever hold.

    Raises:
        ValueError: `layers` is empty, or `block_size` or `max_blocks` is < 1.
    """

    def __init__(self, layers: Sequence[LayerGeometry], block_size: int, max_blocks: int) -> None:
        if not layers:
            raise ValueError("layers must describe at least one attention layer")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        self.layers = tuple(layers)
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.capacity_blocks = 0
        self.keys: list[mx.array] = [self._zeros(g.num_kv_heads, g.key_dim, g, 0) for g in layers]
        self.values: list[mx.array] = [
            self._zeros(g.num_kv_heads, g.value_dim, g, 0) for g in layers
        ]

    def _zeros(self, heads: int, dim: int, geometry: LayerGeometry, blocks: int) -> mx.array:
        return mx.zeros((blocks * self.block_size, heads, dim), geometry.dtype)

    @property
    def bytes_per_block(self) -> int:
        """Key and value bytes of one block over all layers."""
        return self.block_size * sum(g.bytes_per_token for g in self.layers)

    @property
    def nbytes(self) -> int:
        """Bytes the pools hold now."""
        return self.capacity_blocks * self.bytes_per_block

    def ensure_capacity(self, num_blocks: int) -> None:
        """Grow every pool to hold at least `num_blocks` blocks (ids 0 .. num_blocks - 1).

        Raises:
            ValueError: `num_blocks` exceeds `max_blocks`.
        """
        if num_blocks <= self.capacity_blocks:
            return
        if num_blocks > self.max_blocks:
            raise ValueError(f"num_blocks must be <= {self.max_blocks}, got {num_blocks}")
        grown = int(self.capacity_blocks * _GROWTH_FACTOR)
        target = min(self.max_blocks, max(num_blocks, grown, _MIN_GROWTH_BLOCKS))
        extra = target - self.capacity_blocks
        for layer, geometry in enumerate(self.layers):
            heads = geometry.num_kv_heads
            self.keys[layer] = mx.concatenate(
                [self.keys[layer], self._zeros(heads, geometry.key_dim, geometry, extra)]
            )
            self.values[layer] = mx.concatenate(
                [self.values[layer], self._zeros(heads, geometry.value_dim, geometry, extra)]
            )
        self.capacity_blocks = target
        mx.eval(self.keys, self.values)

    def write(self, layer: int, slots: mx.array, keys: mx.array, values: mx.array) -> None:
        """Store new positions.

        Args:
            slots: (N,) int32 slot ids, one per position.
            keys: (N, H_kv, D_k) keys, in the layer's dtype.
            values: (N, H_kv, D_v) values.
        """
        self.keys[layer][slots] = keys
        self.values[layer][slots] = values

    def gather(self, layer: int, slots: mx.array) -> tuple[mx.array, mx.array]:
        """Read positions by slot id.

        Args:
            slots: (B, S) int32 slot ids.

        Returns:
            Keys (B, H_kv, S, D_k) and values (B, H_kv, S, D_v).
        """
        keys = self.keys[layer][slots].transpose(0, 2, 1, 3)
        values = self.values[layer][slots].transpose(0, 2, 1, 3)
        return keys, values

    def copy_blocks(self, copies: Sequence[BlockCopy]) -> None:
        """Copy whole blocks (copy-on-write), every layer, before the step that writes them."""
        if not copies:
            return
        offsets = mx.arange(self.block_size)
        src = mx.array([c.src_block_id for c in copies])[:, None] * self.block_size + offsets
        dst = mx.array([c.dst_block_id for c in copies])[:, None] * self.block_size + offsets
        src, dst = src.reshape(-1), dst.reshape(-1)
        for layer in range(len(self.layers)):
            self.keys[layer][dst] = self.keys[layer][src]
            self.values[layer][dst] = self.values[layer][src]

    def arrays(self) -> list[mx.array]:
        """Every pool, to evaluate with a step's outputs so writes do not pile up lazily."""
        return [*self.keys, *self.values]
