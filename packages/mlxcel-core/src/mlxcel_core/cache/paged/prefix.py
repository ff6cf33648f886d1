"""Block hashes: the identity of a full block of tokens in the prefix cache.

A full block's hash chains its parent block's hash, its own token ids and any extra keys
(the request's LoRA adapter scales, and for each image whose placeholder positions the block
holds, the image's content hash and span: `KeyedSpan`). Two blocks share a hash only if they
hold the same tokens after the same prefix, so a block found by hash holds keys and values
that are valid to reuse.

Source: vLLM's automatic prefix caching (`vllm/v1/core/kv_cache_utils.py`,
`hash_block_tokens`), which hashes the pickled `(parent, tokens, extra)` tuple the same way.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NewType

BlockHash = NewType("BlockHash", int)
"""A block's identity in the prefix cache: 64 bits of a BLAKE2b digest, as an int."""

_DIGEST_BYTES = 8

BlockHashExtra = tuple[int | str | bytes, ...]
"""Further keys a block's keys and values depend on beyond its token ids."""


@dataclass(frozen=True)
class KeyedSpan:
    """Positions of a sequence whose keys and values depend on more than their token ids.

    An image's run of placeholder tokens is one: equal placeholder tokens of different
    images hold different embeddings, so a block holding any of those positions is keyed
    by the image's content hash too.

    Attributes:
        start: the span's first position (an index into the sequence's tokens).
        stop: one past its last position.
        key: what the span's positions hold (an image's content hash).

    Raises:
        ValueError: `start` is negative or the span is empty.
    """

    start: int
    stop: int
    key: str

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.stop:
            raise ValueError(f"a span needs 0 <= start < stop, got {self.start}..{self.stop}")


def block_extra(
    extra: BlockHashExtra, spans: Sequence[KeyedSpan], start: int, block_size: int
) -> BlockHashExtra:
    """The extra key of the block holding positions [start, start + block_size).

    Args:
        extra: the key every block of the sequence has (its adapter scales).
        spans: the sequence's keyed spans, in position order.
        start: the block's first position.
        block_size: tokens per block.

    Returns:
        `extra`, followed by `(key, span start, span stop)` for each span overlapping the
        block; a block that overlaps none keeps `extra` as it is, so its hash is the one
        it has without spans. With the chain from the sequence's first block, the absolute
        span says which of the span's positions the block holds.
    """
    stop = start + block_size
    overlapping = tuple(
        part
        for span in spans
        if span.start < stop and start < span.stop
        for part in (span.key, span.start, span.stop)
    )
    return extra + overlapping if overlapping else extra


def hash_block_tokens(
    parent: BlockHash | None, token_ids: Sequence[int], extra: BlockHashExtra = ()
) -> BlockHash:
    """Hash one full block of tokens, chained to the block before it.

    The digest is BLAKE2b over the pickled `(parent, token_ids, extra)` tuple: stable across
    processes (unlike the built-in `hash`, which maps small ints to themselves and is seeded
    per process for strings), so blocks handed to another process keep their identity.

    Args:
        parent: the hash of the previous block, or None for a sequence's first block.
        token_ids: the block's token ids, exactly `block_size` of them.
        extra: further keys the block's keys and values depend on (ints, strs or bytes,
            e.g. content hashes of images), empty for text.

    Returns:
        The block's hash.
    """
    payload = pickle.dumps((parent, tuple(map(int, token_ids)), extra), protocol=5)
    digest = hashlib.blake2b(payload, digest_size=_DIGEST_BYTES).digest()
    return BlockHash(int.from_bytes(digest, "little"))


def hash_token_blocks(
    token_ids: Sequence[int],
    block_size: int,
    parent: BlockHash | None = None,
    extra: BlockHashExtra = (),
    *,
    spans: Sequence[KeyedSpan] = (),
    first_position: int = 0,
) -> list[BlockHash]:
    """Hash every full block of `token_ids`; a trailing partial block gets no hash.

    Args:
        token_ids: tokens starting at a block boundary.
        block_size: tokens per block.
        parent: the hash of the block before `token_ids[0]`, or None at a sequence's start.
        extra: further keys every block's keys and values depend on (see
            `hash_block_tokens`).
        spans: the sequence's keyed spans (see `block_extra`), in position order.
        first_position: the sequence position of `token_ids[0]`, where `spans` count from.

    Returns:
        One hash per full block, `len(token_ids) // block_size` of them, in position order.

    Raises:
        ValueError: `block_size` is < 1.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    hashes: list[BlockHash] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        keys = block_extra(extra, spans, first_position + start, block_size)
        parent = hash_block_tokens(parent, token_ids[start : start + block_size], keys)
        hashes.append(parent)
    return hashes
