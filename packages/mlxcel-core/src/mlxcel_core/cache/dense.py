"""A dense KV cache: one contiguous, step-grown buffer per layer."""

from __future__ import annotations

import mlx.core as mx

from mlxcel_core.cache.protocol import AttentionMask


def make_causal_mask(num_queries: int, offset: int, *, window_size: int | None = None) -> mx.array:
    """Boolean mask (num_queries, offset + num_queries); True where a query may attend.

    Query i sits at position offset + i and sees keys at positions <= its own (and, with
    `window_size`, only the last `window_size` of them).
    """
    key_positions = mx.arange(offset + num_queries)[None]
    query_positions = mx.arange(offset, offset + num_queries)[:, None]
    mask = query_positions >= key_positions
    if window_size is not None:
        mask = mask & (query_positions < key_positions + window_size)
    return mask


class DenseKVCache:
    """Keys and values in buffers that grow `step` positions at a time.

    Growing in steps rather than per token keeps decode from reallocating every step;
    writes go into the preallocated tail with slice assignment.

    Args:
        step: positions added each time the buffer grows (tokens).
    """

    def __init__(self, step: int = 256) -> None:
        if step < 1:
            raise ValueError(f"step must be >= 1, got {step}")
        self.step = step
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self._offset = 0

    @property
    def offset(self) -> int:
        return self._offset

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        start, num_new = self._offset, keys.shape[2]
        if self.keys is None or self.values is None or start + num_new > self.keys.shape[2]:
            self._grow(keys, values, start + num_new)
        assert self.keys is not None and self.values is not None
        self._offset = start + num_new
        self.keys[..., start : self._offset, :] = keys
        self.values[..., start : self._offset, :] = values
        return self.keys[..., : self._offset, :], self.values[..., : self._offset, :]

    def _grow(self, keys: mx.array, values: mx.array, needed: int) -> None:
        B, H, _, D_k = keys.shape
        D_v = values.shape[3]
        capacity = -(-needed // self.step) * self.step
        new_keys = mx.zeros((B, H, capacity, D_k), keys.dtype)
        new_values = mx.zeros((B, H, capacity, D_v), values.dtype)
        if self.keys is not None and self.values is not None:
            new_keys[..., : self._offset, :] = self.keys[..., : self._offset, :]
            new_values[..., : self._offset, :] = self.values[..., : self._offset, :]
        self.keys, self.values = new_keys, new_values

    def make_mask(
        self, num_queries: int, *, return_array: bool = False, window_size: int | None = None
    ) -> AttentionMask:
        if window_size is not None or (return_array and num_queries > 1):
            return make_causal_mask(num_queries, self._offset, window_size=window_size)
        return "causal" if num_queries > 1 else None

    def trim(self, num_tokens: int) -> int:
        dropped = min(self._offset, max(num_tokens, 0))
        self._offset -= dropped
        return dropped

    @property
    def state(self) -> list[mx.array]:
        """The arrays to evaluate after a prefill chunk (empty before the first update)."""
        return [] if self.keys is None or self.values is None else [self.keys, self.values]

    @property
    def nbytes(self) -> int:
        """Bytes held by the key and value buffers."""
        return sum(array.nbytes for array in self.state)
