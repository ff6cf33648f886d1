"""Recurrent state slots: each running sequence's state arrays, beside the paged KV pool.

A recurrent layer (Mamba's selective scan and its convolution, a gated delta net, RWKV's
token shift and WKV state, a short convolution) carries a few fixed-size arrays from one
forward pass to the next instead of keys and values; mlx-lm's layers read and write them
by index on an `ArraysCache` (`cache[0]`, `cache[1] = state`). Here every state layer has
one pool per array, of shape (num_slots, ...), and a sequence owns one slot (the engine's
running slot) while it runs. A forward pass gathers its rows' slots into a (B, ...) view
the model reads, and scatters what the model writes back into the same slots: lazy MLX
updates, evaluated with the step.

A row that starts from nothing (no position computed) reads no state at all: the view
gives None, as a fresh mlx-lm `ArraysCache` does, so every model starts exactly as it
does under mlx-lm. The engine never mixes such rows with continuing ones in one pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx


@dataclass(frozen=True)
class StateArrayGeometry:
    """The shape of one state array of one sequence.

    Attributes:
        shape: the array's shape without its leading batch axis.
        dtype: its dtype.
    """

    shape: tuple[int, ...]
    dtype: mx.Dtype

    @property
    def nbytes(self) -> int:
        """Bytes one sequence's array takes."""
        size = self.dtype.size
        for dim in self.shape:
            size *= dim
        return size


StateLayerGeometry = tuple[StateArrayGeometry | None, ...]
"""One state layer's arrays by index; None for an index the model never writes."""


def state_bytes_per_sequence(layers: Sequence[StateLayerGeometry]) -> int:
    """Bytes one sequence's state takes over all state layers."""
    return sum(array.nbytes for layer in layers for array in layer if array is not None)


class StateCache:
    """The state-layer cache protocol mlx-lm's recurrent layers call (`ArraysCache`'s).

    Indexing reads and writes the layer's state arrays, each (B, ...); `lengths` is None
    (every row's new tokens are real: passes are never padded), so `make_mask` is None
    and `advance` has nothing to count.
    """

    lengths: mx.array | None = None

    def __len__(self) -> int:
        """The layer's number of state arrays."""
        raise NotImplementedError

    def __getitem__(self, index: int) -> mx.array | None:
        raise NotImplementedError

    def __setitem__(self, index: int, value: mx.array) -> None:
        raise NotImplementedError

    def advance(self, num_tokens: int) -> None:
        """Nothing to do: without padding no row has a length to count down."""

    def make_mask(self, num_queries: int) -> mx.array | None:
        """None: every position of every row is real."""
        return None


class CompositeCache:
    """A layer's several caches (mlx-lm's `CacheList`), indexed in the layout's order."""

    def __init__(self, parts: Sequence[object]) -> None:
        self.parts = tuple(parts)

    def __getitem__(self, index: int) -> object:
        return self.parts[index]


class StatePool:
    """The state arrays of every state layer, one slot per running sequence.

    Args:
        layers: each state layer's array geometry, in the cache layout's state order.
        num_slots: slots (sequences running at once).

    Raises:
        ValueError: `num_slots` is < 1.
    """

    def __init__(self, layers: Sequence[StateLayerGeometry], num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.layers = tuple(layers)
        self.num_slots = num_slots
        self.pools: list[list[mx.array | None]] = [
            [
                None if array is None else mx.zeros((num_slots, *array.shape), array.dtype)
                for array in layer
            ]
            for layer in self.layers
        ]
        mx.eval(self.arrays())

    @property
    def bytes_per_slot(self) -> int:
        return state_bytes_per_sequence(self.layers)

    @property
    def nbytes(self) -> int:
        return self.num_slots * self.bytes_per_slot

    def arrays(self) -> list[mx.array]:
        """Every pool array, to evaluate with a step's outputs."""
        return [array for layer in self.pools for array in layer if array is not None]

    def copy_slots(self, copies: Sequence[tuple[int, int]]) -> None:
        """Copy whole slots, `(source, destination)` pairs, every layer (a forked sequence
        starting from its parent's state).

        Raises:
            ValueError: a slot is outside [0, num_slots).
        """
        if not copies:
            return
        for source, destination in copies:
            for slot in (source, destination):
                if not 0 <= slot < self.num_slots:
                    raise ValueError(f"slot must be in [0, {self.num_slots}), got {slot}")
        sources = mx.array([source for source, _ in copies])
        destinations = mx.array([destination for _, destination in copies])
        for layer in self.pools:
            for array in layer:
                if array is not None:
                    array[destinations] = array[sources]


class SlotStateCache(StateCache):
    """One state layer's arrays for the rows of one forward pass.

    Reading index i gives (B, ...) the rows' arrays gathered from their slots, or None
    for rows starting fresh until the model writes it; writing stores the rows' new arrays
    into their slots.

    Args:
        pool: the state pool.
        layer: the state layer (its index among the layout's state parts).
        slots: (B,) int32 slots of the pass's rows.
        fresh: the rows start from nothing (no position computed yet).

    Raises:
        ValueError: on a write, the index is outside the layer's arrays, or the array's
            shape or dtype is not the one the pool was made with.
    """

    def __init__(self, pool: StatePool, layer: int, slots: mx.array, *, fresh: bool) -> None:
        self._pool = pool
        self._layer = layer
        self._slots = slots
        self._fresh = fresh
        self._values: dict[int, mx.array] = {}

    def __len__(self) -> int:
        return len(self._pool.pools[self._layer])

    def __getitem__(self, index: int) -> mx.array | None:
        if index in self._values or self._fresh:
            return self._values.get(index)
        array = self._pool.pools[self._layer][index]
        if array is None:
            return None
        value = array[self._slots]
        self._values[index] = value
        return value

    def __setitem__(self, index: int, value: mx.array) -> None:
        pools = self._pool.pools[self._layer]
        if not 0 <= index < len(pools):
            raise ValueError(
                f"state layer {self._layer} has {len(pools)} arrays; index {index} is outside"
            )
        array, geometry = pools[index], self._pool.layers[self._layer][index]
        if array is None or geometry is None:
            raise ValueError(
                f"state array {index} of state layer {self._layer} was not written by the "
                "recording pass, so it has no slots"
            )
        if tuple(value.shape[1:]) != geometry.shape or value.dtype != geometry.dtype:
            raise ValueError(
                f"state array {index} of state layer {self._layer} must be "
                f"(B, {', '.join(map(str, geometry.shape))}) {geometry.dtype}, got "
                f"{tuple(value.shape)} {value.dtype}"
            )
        self._values[index] = value
        array[self._slots] = value


def make_state_caches(pool: StatePool, slots: mx.array, *, fresh: bool) -> list[SlotStateCache]:
    """One view per state layer for a pass over the rows in `slots` ((B,) int32)."""
    return [SlotStateCache(pool, layer, slots, fresh=fresh) for layer in range(len(pool.layers))]
