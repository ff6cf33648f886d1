"""The arrays behind a paged KV cache: one key pool and one value pool per layer."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from mlxcel_core.cache.paged.centering import (
    RowAnchors,
    load_centered,
    store_centered,
    store_parts,
)
from mlxcel_core.cache.paged.geometry import LayerGeometry
from mlxcel_core.cache.paged.manager import BlockCopy
from mlxcel_core.cache.paged.residual import ResidualPlanner, ResidualSlots, residual_dtype
from mlxcel_core.cache.quant import (
    AUTO,
    KVCodec,
    check_cache_type,
    is_quantized,
    make_kv_codec,
)
from mlxcel_core.cache.state import StateLayerGeometry, StatePool

# Pools grow by at least half their size, so growing to N blocks copies O(N) in total.
_GROWTH_FACTOR = 1.5
_MIN_GROWTH_BLOCKS = 16


# One pool: a layer's keys (or values) as the arrays their codec stores, each (slots, H, W).
Pool = tuple[mx.array, ...]


class PagedKVStorage:
    """Key and value pools of `block_size`-token blocks, grown as blocks are materialized.

    Layer l's keys live in arrays of shape (capacity * block_size, H_kv, W): position p of
    block b is slot `b * block_size + p`. Layers are split into block groups (full
    attention, each sliding window: `mlxcel_core.cache.block_groups`), each with its own
    block ids and capacity: a layer's pools hold its group's blocks. With cache type
    "auto" a pool is one array of the layer's keys as the model made them (W = D_k); any
    other type stores its codec's components (`mlxcel_core.cache.quant`), encoded on
    `write` and decoded on `gather`; keys of codecs marked `centered` are stored, past a
    row's first block, relative to that block's mean (`centering`).
    Block 0 is the null block: padding writes land there and nothing reads it unmasked.

    Args:
        layers: the geometry of each attention layer, in model order.
        block_size: tokens per block.
        max_blocks: the most blocks the pools may ever hold: one count for every group,
            or one per group.
        cache_type_k: how keys are stored (`mlxcel_core.cache.quant.CACHE_TYPES`).
        cache_type_v: how values are stored.
        decode_kernel: let decode passes attend straight from the pools with
            `mlxcel_core.kernels.paged_attention` where a kernel serves the device and the
            pools' types; False keeps the gather-then-attend path everywhere.
        residual_window: positions at the end of each row whose quantized keys and
            values are also kept exact, in `residual_dtype` of the layer's (`residual`);
            0 keeps none. Decode passes then attend through the gather path, since the
            kernels read the pools alone.
        num_residual_blocks: blocks of exact copies to allocate for that (>= 1 with a
            window).
        state_layers: the array geometry of each recurrent state layer (the model's
            cache layout's state parts), held in `states` beside the pools.
        num_state_slots: state slots, one per sequence running at once (>= 1 with state
            layers).
        layer_groups: each layer's block group (0 .. len(windows) - 1); empty puts every
            layer in group 0.
        windows: each group's window (positions its layers read back), None for full
            attention: a windowed group's passes read only each row's window.

    Attributes:
        max_blocks: per group, the most blocks its pools may hold.
        capacity_blocks: per group, the blocks its pools hold now.
        bytes_per_block: per group, key and value bytes of one block over its layers,
            as stored.
        states: the state slots of the recurrent layers; None without state layers.
        layers_attending_in_cache: the layers whose attention has come through
            `PagedLayerCache.attention` (the model routes it to the cache and uses no
            attention sinks); their decode passes fetch the context only if attention
            needs it.

    Raises:
        ValueError: `layers` and `state_layers` are both empty, `block_size` or
            `max_blocks` is < 1, `max_blocks` or `layer_groups` does not match the groups,
            state layers come without slots, a cache type
            is unknown or cannot take a layer's head dim, or a residual window is asked
            for without residual blocks or with neither cache type quantized.
    """

    def __init__(
        self,
        layers: Sequence[LayerGeometry],
        block_size: int,
        max_blocks: int | Sequence[int],
        *,
        cache_type_k: str = AUTO,
        cache_type_v: str = AUTO,
        decode_kernel: bool = True,
        residual_window: int = 0,
        num_residual_blocks: int = 0,
        state_layers: Sequence[StateLayerGeometry] = (),
        num_state_slots: int = 0,
        layer_groups: Sequence[int] = (),
        windows: Sequence[int | None] = (None,),
    ) -> None:
        if not layers and not state_layers:
            raise ValueError("layers must describe at least one attention or state layer")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.windows = tuple(windows)
        num_groups = len(self.windows)
        self.max_blocks = (
            (max_blocks,) * num_groups if isinstance(max_blocks, int) else tuple(max_blocks)
        )
        if len(self.max_blocks) != num_groups or min(self.max_blocks) < 1:
            raise ValueError(f"max_blocks must be {num_groups} counts >= 1, got {max_blocks}")
        self.layer_groups = tuple(layer_groups) or (0,) * len(layers)
        if len(self.layer_groups) != len(layers) or not set(self.layer_groups) <= set(
            range(num_groups)
        ):
            raise ValueError(
                f"layer_groups must give each of {len(layers)} layers a group in "
                f"[0, {num_groups}), got {layer_groups}"
            )
        check_cache_type("cache_type_k", cache_type_k)
        check_cache_type("cache_type_v", cache_type_v)
        self.layers = tuple(layers)
        self.block_size = block_size
        self.cache_type_k = cache_type_k
        self.cache_type_v = cache_type_v
        self.decode_kernel = decode_kernel
        self.layers_attending_in_cache: set[int] = set()
        self.capacity_blocks = [0] * num_groups
        self.states = StatePool(state_layers, num_state_slots) if state_layers else None
        self._heads_first: tuple[mx.array, int, mx.array] | None = None
        self._key_codecs = [make_kv_codec(cache_type_k, g.key_dim) for g in layers]
        self._value_codecs = [make_kv_codec(cache_type_v, g.value_dim) for g in layers]
        # Computed once: the engine's statistics read it every step, and it makes codecs.
        self.bytes_per_block = tuple(
            block_size
            * sum(
                g.bytes_per_token(cache_type_k, cache_type_v)
                for g, group in zip(layers, self.layer_groups, strict=True)
                if group == index
            )
            for index in range(num_groups)
        )
        self._residual: list[ResidualPlanner] = []
        self.exact_keys: list[mx.array] = []
        self.exact_values: list[mx.array] = []
        if residual_window:
            if not (is_quantized(cache_type_k) or is_quantized(cache_type_v)):
                raise ValueError("a residual window needs a quantized cache type")
            # More residual blocks than blocks are never used.
            self._residual = [
                ResidualPlanner(residual_window, block_size, min(num_residual_blocks, blocks))
                for blocks in self.max_blocks
            ]
            for g, group in zip(layers, self.layer_groups, strict=True):
                # Residual block 0 is the null one, which positions without a copy write to.
                slots = (self._residual[group].num_residual_blocks + 1) * block_size
                dtype = residual_dtype(g.dtype)
                if is_quantized(cache_type_k):
                    self.exact_keys.append(mx.zeros((slots, g.num_kv_heads, g.key_dim), dtype))
                if is_quantized(cache_type_v):
                    self.exact_values.append(mx.zeros((slots, g.num_kv_heads, g.value_dim), dtype))
            mx.eval(self.exact_keys, self.exact_values)
        self.keys: list[Pool] = [
            self._zeros(g, g.key_dim, codec, 0)
            for g, codec in zip(layers, self._key_codecs, strict=True)
        ]
        self.values: list[Pool] = [
            self._zeros(g, g.value_dim, codec, 0)
            for g, codec in zip(layers, self._value_codecs, strict=True)
        ]

    def _zeros(self, geometry: LayerGeometry, dim: int, codec: KVCodec | None, blocks: int) -> Pool:
        slots, heads = blocks * self.block_size, geometry.num_kv_heads
        if codec is None:
            return (mx.zeros((slots, heads, dim), geometry.dtype),)
        return tuple(mx.zeros((slots, heads, c.width), c.dtype) for c in codec.components)

    @property
    def nbytes(self) -> int:
        """Bytes the pools, the residual blocks and the state slots hold now."""
        exact = sum(array.nbytes for array in (*self.exact_keys, *self.exact_values))
        states = 0 if self.states is None else self.states.nbytes
        pools = sum(
            capacity * size
            for capacity, size in zip(self.capacity_blocks, self.bytes_per_block, strict=True)
        )
        return pools + exact + states

    @property
    def residual_window(self) -> int:
        """Positions at the end of each row kept exact (0 for none)."""
        return self._residual[0].window if self._residual else 0

    @property
    def exact_sides(self) -> tuple[bool, bool]:
        """Whether the keys, and the values, have exact copies (their type is quantized
        and there is a residual window)."""
        return bool(self.exact_keys), bool(self.exact_values)

    def plan_residual(
        self,
        tables: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        *,
        group: int = 0,
        key_positions: np.ndarray | None = None,
    ) -> ResidualSlots | None:
        """Update a group's residual blocks for one pass (`residual.ResidualPlanner.plan`)
        and return its slots; None when the storage keeps none."""
        if not self._residual:
            return None
        return self._residual[group].plan(tables, offsets, lengths, key_positions)

    def ensure_capacity(self, num_blocks: int, group: int = 0) -> None:
        """Grow a group's pools to hold at least `num_blocks` blocks (ids 0 ..
        num_blocks - 1).

        Raises:
            ValueError: `num_blocks` exceeds the group's `max_blocks`.
        """
        capacity, most = self.capacity_blocks[group], self.max_blocks[group]
        if num_blocks <= capacity:
            return
        if num_blocks > most:
            raise ValueError(f"num_blocks must be <= {most}, got {num_blocks}")
        grown = int(capacity * _GROWTH_FACTOR)
        target = min(most, max(num_blocks, grown, _MIN_GROWTH_BLOCKS))
        extra = target - capacity
        for layer, geometry in enumerate(self.layers):
            if self.layer_groups[layer] != group:
                continue
            key_codec, value_codec = self._key_codecs[layer], self._value_codecs[layer]
            self.keys[layer] = _concatenate(
                self.keys[layer], self._zeros(geometry, geometry.key_dim, key_codec, extra)
            )
            self.values[layer] = _concatenate(
                self.values[layer], self._zeros(geometry, geometry.value_dim, value_codec, extra)
            )
        self.capacity_blocks[group] = target
        mx.eval(self.arrays())

    def write(
        self,
        layer: int,
        slots: mx.array,
        keys: mx.array,
        values: mx.array,
        anchors: RowAnchors | None = None,
        residual_slots: mx.array | None = None,
    ) -> None:
        """Store new positions.

        Args:
            slots: (N,) int32 slot ids, one per position.
            keys: (N, H_kv, D_k) keys, in the layer's dtype.
            values: (N, H_kv, D_v) values.
            anchors: the rows' first blocks, for keys of centered codecs (values are
                never centered); None stores every position on its own, as if each lay
                in its row's first block.
            residual_slots: (N,) int32 residual slots of the positions (`ResidualSlots`),
                with a residual window.
        """
        _store(self.keys[layer], self._key_codecs[layer], slots, keys, anchors)
        _store(self.values[layer], self._value_codecs[layer], slots, values, None)
        if residual_slots is None:
            return
        if self.exact_keys:
            exact_keys = self.exact_keys[layer]
            exact_keys[residual_slots] = keys.astype(exact_keys.dtype)
        if self.exact_values:
            exact_values = self.exact_values[layer]
            exact_values[residual_slots] = values.astype(exact_values.dtype)

    def gather(
        self,
        layer: int,
        slots: mx.array,
        anchors: RowAnchors | None = None,
        exact: tuple[mx.array, mx.array] | None = None,
    ) -> tuple[mx.array, mx.array]:
        """Read positions by slot id.

        Args:
            slots: (B, S) int32 slot ids.
            anchors: the rows' first blocks, as `write` was given them.
            exact: (B, S) int32 residual slots and (B, S) bool, True where a position of
                a quantized side is read from its exact copy instead (`ResidualSlots`).

        Returns:
            Keys (B, H_kv, S, D_k) and values (B, H_kv, S, D_v), in the layer's dtype;
            row-contiguous when both pools store the layer's own dtype and no exact copies
            are read (gathered heads first, so attention's products read them as they are).
        """
        codecs = (self._key_codecs[layer], self._value_codecs[layer])
        if codecs == (None, None) and exact is None:
            index = self._heads_first_index(slots, self.layers[layer].num_kv_heads)
            return _take_heads_first(self.keys[layer][0], index), _take_heads_first(
                self.values[layer][0], index
            )
        dtype = self.layers[layer].dtype
        keys = _load(self.keys[layer], self._key_codecs[layer], slots, dtype, anchors)
        values = _load(self.values[layer], self._value_codecs[layer], slots, dtype, None)
        if exact is not None:
            residual_slots, is_exact = exact
            is_exact = is_exact[..., None, None]
            if self.exact_keys:
                exact_keys = self.exact_keys[layer][residual_slots].astype(dtype)
                keys = mx.where(is_exact, exact_keys, keys)
            if self.exact_values:
                exact_values = self.exact_values[layer][residual_slots].astype(dtype)
                values = mx.where(is_exact, exact_values, values)
        return keys.transpose(0, 2, 1, 3), values.transpose(0, 2, 1, 3)

    def _heads_first_index(self, slots: mx.array, num_heads: int) -> mx.array:
        """(B, H, S) int32 rows of a pool viewed as (slots * H, W): head h of slot
        `slots[b, s]` at `slots[b, s] * H + h`. Every layer of a pass reads the same slots,
        so the latest index is kept (with its slots, never mistaken for later ones)."""
        held = self._heads_first
        if held is not None and held[0] is slots and held[1] == num_heads:
            return held[2]
        heads = mx.arange(num_heads, dtype=mx.int32)[:, None]
        index = slots[:, None, :] * num_heads + heads
        self._heads_first = (slots, num_heads, index)
        return index

    def codecs(self, layer: int) -> tuple[KVCodec | None, KVCodec | None]:
        """The codecs of the layer's key and value pools; None for one that stores the
        layer's own dtype (cache type "auto")."""
        return self._key_codecs[layer], self._value_codecs[layer]

    def centers_keys(self, layer: int) -> bool:
        """Whether the layer's keys are stored relative to their row's first block, so
        that `write` and `gather` need the rows' anchors."""
        codec = self._key_codecs[layer]
        return codec is not None and codec.centered

    def copy_blocks(self, copies: Sequence[BlockCopy]) -> None:
        """Copy whole blocks (copy-on-write), every layer of their group, before the step
        that writes them; with their exact copies where they have residual blocks."""
        for group in sorted({copy.group for copy in copies}):
            self._copy_group_blocks(group, [c for c in copies if c.group == group])

    def _copy_group_blocks(self, group: int, copies: Sequence[BlockCopy]) -> None:
        src = self._block_slots([c.src_block_id for c in copies])
        dst = self._block_slots([c.dst_block_id for c in copies])
        for pool in self._pool_arrays(group):
            pool[dst] = pool[src]
        if not self._residual:
            return
        residual = self._residual[group]
        pairs = [residual.copy(c.src_block_id, c.dst_block_id) for c in copies]
        residual_pairs = [pair for pair in pairs if pair is not None]
        if residual_pairs:
            src = self._block_slots([pair[0] for pair in residual_pairs])
            dst = self._block_slots([pair[1] for pair in residual_pairs])
            for array in self._exact_arrays(group):
                array[dst] = array[src]

    def read_blocks(self, block_ids: Sequence[int], group: int = 0) -> list[mx.array]:
        """The stored contents of whole blocks of a group, to hand to another storage of
        the same geometry and cache types (disaggregated prefill).

        Returns:
            One lazy array per pool array of the group's layers, in `arrays()` order,
            each (len(block_ids) * block_size, H_kv, W) in that array's dtype.
        """
        slots = self._block_slots(block_ids)
        return [array[slots] for array in self._pool_arrays(group)]

    def write_blocks(
        self, block_ids: Sequence[int], contents: Sequence[mx.array], group: int = 0
    ) -> None:
        """Overwrite whole blocks with contents `read_blocks` returned elsewhere.

        The blocks lose their exact copies: the contents are the stored ones alone.

        Raises:
            ValueError: `contents` does not match the pools in number, shape or dtype.
        """
        arrays = self._pool_arrays(group)
        if len(contents) != len(arrays):
            raise ValueError(f"contents must hold {len(arrays)} arrays, got {len(contents)}")
        slots = self._block_slots(block_ids)
        for array, content in zip(arrays, contents, strict=True):
            expected = (len(block_ids) * self.block_size, *array.shape[1:])
            if content.shape != expected or content.dtype != array.dtype:
                raise ValueError(
                    f"block contents must be {expected} {array.dtype}, "
                    f"got {tuple(content.shape)} {content.dtype}"
                )
            array[slots] = content
        if self._residual:
            self._residual[group].drop(list(block_ids))

    def _block_slots(self, block_ids: Sequence[int]) -> mx.array:
        offsets = mx.arange(self.block_size)
        return (mx.array(list(block_ids))[:, None] * self.block_size + offsets).reshape(-1)

    def arrays(self) -> list[mx.array]:
        """Every pool's arrays, the exact copies and the state slots, to evaluate with a
        step's outputs so writes do not pile up."""
        states = [] if self.states is None else self.states.arrays()
        return [*self._pool_arrays(), *self.exact_keys, *self.exact_values, *states]

    def _pool_arrays(self, group: int | None = None) -> list[mx.array]:
        """Every pool's arrays, or those of one group's layers."""
        pools = [
            pool
            for side in (self.keys, self.values)
            for layer, pool in enumerate(side)
            if group is None or self.layer_groups[layer] == group
        ]
        return [array for pool in pools for array in pool]

    def _exact_arrays(self, group: int) -> list[mx.array]:
        """The exact copies of one group's layers."""
        return [
            array
            for side in (self.exact_keys, self.exact_values)
            for layer, array in enumerate(side)
            if self.layer_groups[layer] == group
        ]


def _concatenate(pool: Pool, extra: Pool) -> Pool:
    return tuple(mx.concatenate([old, new]) for old, new in zip(pool, extra, strict=True))


def _store(
    pool: Pool, codec: KVCodec | None, slots: mx.array, x: mx.array, anchors: RowAnchors | None
) -> None:
    if codec is None:
        store_parts(pool, (x,), slots)
    elif codec.centered and anchors is not None:
        store_centered(pool, codec, slots, x, anchors)
    else:
        store_parts(pool, codec.encode(x), slots)


def _take_heads_first(pool: mx.array, index: mx.array) -> mx.array:
    """(B, H, S, W) of a (slots, H, W) pool at a `_heads_first_index`, in one gather."""
    return pool.reshape(-1, pool.shape[-1])[index]


def _load(
    pool: Pool,
    codec: KVCodec | None,
    slots: mx.array,
    dtype: mx.Dtype,
    anchors: RowAnchors | None,
) -> mx.array:
    if codec is None:
        return pool[0][slots]
    if codec.centered and anchors is not None:
        return load_centered(pool, codec, slots, dtype, anchors)
    return codec.decode([array[slots] for array in pool], dtype)
