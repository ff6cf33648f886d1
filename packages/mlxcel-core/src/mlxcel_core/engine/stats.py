"""A snapshot of the engine's state, for `/slots`, `/metrics` and logs."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SlotState:
    """A running sequence.

    Attributes:
        slot: its slot, 0 .. max_num_seqs - 1.
        request_id: its group's `RequestHandle.request_id`.
        index: its choice index within the group.
        num_prompt_tokens: prompt length (tokens).
        num_cached_tokens: prompt tokens the prefix cache supplied.
        num_generated: tokens generated so far.
    """

    slot: int
    request_id: int
    index: int
    num_prompt_tokens: int
    num_cached_tokens: int
    num_generated: int


@dataclass(frozen=True)
class EngineStats:
    """The engine after one step.

    Attributes:
        num_running: sequences running.
        num_waiting: sequences waiting (new or preempted).
        num_kv_blocks: usable KV blocks (the null block excluded).
        num_kv_blocks_used: blocks held by sequences.
        num_kv_blocks_cached: blocks holding a prefix-cache entry (used or free).
        kv_cache_bytes: bytes the KV pools hold now (they grow with use).
        prefix_cache_queried_tokens: prompt tokens looked up in the prefix cache.
        prefix_cache_hit_tokens: of those, tokens found there.
        num_preemptions: sequences preempted so far.
        slots: the running sequences.
    """

    num_running: int = 0
    num_waiting: int = 0
    num_kv_blocks: int = 0
    num_kv_blocks_used: int = 0
    num_kv_blocks_cached: int = 0
    kv_cache_bytes: int = 0
    prefix_cache_queried_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    num_preemptions: int = 0
    slots: tuple[SlotState, ...] = ()

    @property
    def num_kv_blocks_free(self) -> int:
        return self.num_kv_blocks - self.num_kv_blocks_used

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Hit tokens over queried tokens (0 before any query)."""
        if not self.prefix_cache_queried_tokens:
            return 0.0
        return self.prefix_cache_hit_tokens / self.prefix_cache_queried_tokens
