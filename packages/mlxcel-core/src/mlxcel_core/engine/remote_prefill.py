"""Prompt KV computed elsewhere: the engine's seam for disaggregated prefill.

With a `RemotePrefill`, the scheduler gives a new sequence blocks for its whole prompt but
computes none of it: the engine hands the prompt (all but its last token) to the remote
prefill as a `PrefillJob` and keeps stepping the other sequences. When the blocks' contents
arrive (`PrefilledKV`, from another thread), the engine writes them into its pools, counts
those positions as computed, and the sequence joins the batch with its last prompt token,
whose logits it samples from as usual. Sampling never leaves the engine, so seeded requests
and the sampler chain behave as without it. Disaggregated prefill as in Splitwise (Patel et
al., ISCA 2024) and DistServe (Zhong et al., OSDI 2024).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx

from mlxcel_core.cache.paged import KVCacheManager, PagedKVStorage
from mlxcel_core.engine.scheduler import Scheduler
from mlxcel_core.engine.sequence import Sequence as EngineSequence
from mlxcel_core.engine.sequence import SequenceStatus


@dataclass(frozen=True)
class PrefillJob:
    """One prompt whose KV the remote side computes.

    Attributes:
        seq_id: the engine's sequence.
        attempt: the sequence's preemption count when sent: a reply for an older attempt
            (the sequence was preempted or ended meanwhile) is dropped.
        token_ids: the tokens whose KV to compute, positions 0 .. len - 1.
        first_block: the first block (index into the sequence's block table) to return;
            the blocks before it came from the engine's prefix cache.
        num_blocks: blocks to return from `first_block` on.
    """

    seq_id: int
    attempt: int
    token_ids: tuple[int, ...]
    first_block: int
    num_blocks: int


@dataclass(frozen=True)
class PrefilledKV:
    """The contents of a job's blocks.

    Attributes:
        seq_id: the job's sequence.
        attempt: the job's attempt.
        contents: one evaluated array per pool array, in `PagedKVStorage.arrays()` order,
            each (num_blocks * block_size, H_kv, W) in that pool's dtype.
    """

    seq_id: int
    attempt: int
    contents: tuple[mx.array, ...]


class RemotePrefill(Protocol):
    """Where the engine sends prompts to be prefilled."""

    def submit(self, job: PrefillJob) -> None:
        """Queue `job` and return at once; its `PrefilledKV` arrives through the callback
        the factory was given, on another thread."""

    def close(self) -> None:
        """Stop taking jobs and release the remote side (the engine has stopped)."""


# Builds the engine's remote prefill from its KV storage and the callback that hands
# arriving block contents to the engine thread.
RemotePrefillFactory = Callable[[PagedKVStorage, Callable[[PrefilledKV], None]], RemotePrefill]


def returned_block_ids(block_table: Sequence[int], job: PrefillJob) -> list[int]:
    """The block ids a job's contents are written to."""
    return list(block_table[job.first_block : job.first_block + job.num_blocks])


class PrefillDispatch:
    """The engine's side of a `RemotePrefill`: the jobs it sent, and the KV they return.

    Args:
        remote: where prompts are prefilled.
        kv: the engine's KV cache manager.
        storage: the engine's KV pools.
        scheduler: the engine's scheduler, told when a sequence's KV has arrived.
    """

    def __init__(
        self,
        remote: RemotePrefill,
        kv: KVCacheManager,
        storage: PagedKVStorage,
        scheduler: Scheduler,
    ) -> None:
        self.remote = remote
        self._kv = kv
        self._storage = storage
        self._scheduler = scheduler
        # Sequences whose prompt KV is in flight and the jobs sent for them, by seq_id.
        self._jobs: dict[int, tuple[EngineSequence, PrefillJob]] = {}

    def send(self, sequences: Sequence[EngineSequence]) -> None:
        """Send each sequence's prompt, all but its last token, past its cached blocks."""
        size = self._storage.block_size
        for sequence in sequences:
            num_prompt = sequence.num_tokens - 1
            first_block = sequence.num_computed // size
            job = PrefillJob(
                sequence.seq_id,
                sequence.num_preemptions,
                tuple(sequence.token_ids[:num_prompt]),
                first_block,
                -(-num_prompt // size) - first_block,
            )
            self._jobs[sequence.seq_id] = (sequence, job)
            self.remote.submit(job)

    def adopt(self, kv: PrefilledKV) -> None:
        """Write arrived prompt KV into the sequence's blocks, unless the sequence ended or
        was preempted since its job was sent."""
        sequence, job = self._jobs.get(kv.seq_id, (None, None))
        if sequence is None or job is None or job.attempt != kv.attempt:
            return
        del self._jobs[kv.seq_id]
        if sequence.status is not SequenceStatus.RUNNING or not sequence.kv_in_flight:
            return  # it ended, or was preempted and waits to be sent again
        block_ids = returned_block_ids(self._kv.block_table(sequence.seq_id), job)
        self._storage.ensure_capacity(self._kv.materialized_blocks[0])
        self._storage.write_blocks(block_ids, kv.contents)
        self._scheduler.complete_remote_prefill(sequence)
