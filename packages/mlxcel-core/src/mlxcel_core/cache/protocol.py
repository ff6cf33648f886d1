"""The KV cache protocol that attention layers call."""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

import mlx.core as mx

AttentionMask = mx.array | Literal["causal"] | None


class KVCache(Protocol):
    """Per-layer key/value storage for one batch of sequences.

    The method names and mask contract follow mlx-lm's cache classes, so mlx-lm's model
    classes run on mlxcel caches unchanged.
    """

    @property
    def offset(self) -> int:
        """Number of positions already stored (tokens)."""
        ...

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Append new keys and values and return everything stored so far.

        Args:
            keys: (B, H_kv, L, D_k) keys of the L new positions.
            values: (B, H_kv, L, D_v) values of the L new positions.

        Returns:
            Keys (B, H_kv, offset + L, D_k) and values (B, H_kv, offset + L, D_v).
        """
        ...

    def make_mask(
        self, num_queries: int, *, return_array: bool = False, window_size: int | None = None
    ) -> AttentionMask:
        """The attention mask for `num_queries` new positions after `offset` cached ones."""
        ...

    def trim(self, num_tokens: int) -> int:
        """Drop up to `num_tokens` most recent positions; return how many were dropped."""
        ...


@runtime_checkable
class AttentionCache(Protocol):
    """A cache that computes attention over what it stores, in place of the model's
    `scaled_dot_product_attention`, so it can read its storage directly.

    Once a layer's attention has come through `attention`, such a cache may return from
    `update_and_fetch` only the new positions, which the model hands on to `attention`
    unchanged. A model that attends with other keys or values than those (multi-head
    latent attention projects its stored latent first) is declined: `attention` returns
    None, the model attends by itself, and the layer keeps getting its whole context.
    Keys and values another layer's cache of the same pass returned are attended over in
    full (that layer's whole context), where a model hands them to this layer's cache.
    Attention with sinks must not be routed to the cache.
    """

    def attention(
        self,
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        *,
        scale: float,
        mask: AttentionMask,
    ) -> mx.array | None:
        """Attention of `queries` (B, H_q, L, D_k) over the keys (B, H_kv, S, D_k) and
        values (B, H_kv, S, D_v) `update_and_fetch` returned, under `mask` (as
        `make_mask` gave it); (B, H_q, L, D_v) in the queries' dtype. None, computing
        nothing, when `keys` or `values` are not the arrays `update_and_fetch` returned."""
        ...
