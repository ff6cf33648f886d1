"""A snapshot of the engine's state, for `/slots`, `/metrics` and logs."""

from __future__ import annotations

from dataclasses import dataclass

from mlxcel_core.cache.paged import BlockGroupUsage, KVCacheManager, PagedKVStorage
from mlxcel_core.engine.scheduler import Scheduler


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
        num_kv_blocks: usable KV blocks (null blocks excluded), every block group's.
        num_kv_blocks_used: blocks held by sequences, every group's.
        num_kv_blocks_cached: blocks holding a prefix-cache entry (used or free), every
            group's.
        kv_cache_bytes: bytes the KV pools hold now (they grow with use).
        prefix_cache_queried_tokens: prompt tokens looked up in the prefix cache.
        prefix_cache_hit_tokens: of those, tokens found there.
        num_preemptions: sequences preempted so far.
        num_draft_tokens: draft tokens verified so far (speculative decoding).
        num_accepted_draft_tokens: of those, tokens accepted.
        slots: the running sequences.
        kv_groups: each block group's pool (full attention, each sliding window).
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
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    slots: tuple[SlotState, ...] = ()
    kv_groups: tuple[BlockGroupUsage, ...] = ()

    @property
    def num_kv_blocks_free(self) -> int:
        return self.num_kv_blocks - self.num_kv_blocks_used

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Hit tokens over queried tokens (0 before any query)."""
        if not self.prefix_cache_queried_tokens:
            return 0.0
        return self.prefix_cache_hit_tokens / self.prefix_cache_queried_tokens


def make_engine_stats(
    scheduler: Scheduler,
    kv: KVCacheManager,
    storage: PagedKVStorage,
    *,
    num_draft_tokens: int = 0,
    num_accepted_draft_tokens: int = 0,
) -> EngineStats:
    """A snapshot of the engine's state between steps (on the engine thread); the draft
    token totals are the engine's own."""
    return EngineStats(
        num_running=len(scheduler.running),
        num_waiting=len(scheduler.waiting),
        num_kv_blocks=kv.num_usable_blocks,
        num_kv_blocks_used=kv.num_used_blocks,
        num_kv_blocks_cached=kv.num_cached_blocks,
        kv_cache_bytes=storage.nbytes,
        prefix_cache_queried_tokens=kv.num_queried_tokens,
        prefix_cache_hit_tokens=kv.num_hit_tokens,
        num_preemptions=scheduler.num_preemptions,
        num_draft_tokens=num_draft_tokens,
        num_accepted_draft_tokens=num_accepted_draft_tokens,
        slots=tuple(
            SlotState(
                slot=sequence.slot,
                request_id=sequence.handle.request_id,
                index=sequence.request.index,
                num_prompt_tokens=sequence.num_prompt_tokens,
                num_cached_tokens=sequence.num_cached_tokens,
                num_generated=sequence.num_generated,
            )
            for sequence in scheduler.running
            if sequence.slot is not None
        ),
        kv_groups=kv.group_usage(),
    )
