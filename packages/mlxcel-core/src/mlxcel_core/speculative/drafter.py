"""What a drafter is given and what it proposes, for speculative decoding."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx

from mlxcel_core.sampling import Sampler


@dataclass(frozen=True)
class DraftRequest:
    """One sequence of an engine step, as the drafter sees it.

    Every scheduled sequence is passed, drafting or not, so a draft model can keep its KV
    cache level with the target's.

    Attributes:
        token_ids: the sequence's tokens (prompt and generated).
        block_tables: its KV blocks in each block group, which the draft model's cache
            shares with the target's.
        num_target_computed: positions whose target KV will exist after this step's
            non-draft tokens (all of `token_ids` when the sequence decodes).
        num_draft_computed: positions whose draft-model KV exists.
        num_draft_tokens: the most draft tokens to propose (0: propose none).
        sampler: the request's sampler: drafts follow its chain and random stream.
    """

    token_ids: Sequence[int]
    block_tables: Sequence[Sequence[int]]
    num_target_computed: int
    num_draft_computed: int
    num_draft_tokens: int
    sampler: Sampler


@dataclass(frozen=True)
class DraftProposal:
    """A drafter's answer for one sequence.

    Attributes:
        token_ids: the draft tokens, in order (possibly none).
        probs: (len(token_ids), V) float32 distributions the tokens were drawn from, or
            None when they were chosen deterministically (one-hot).
        num_draft_computed: positions whose draft-model KV exists now.
    """

    token_ids: tuple[int, ...]
    probs: mx.array | None
    num_draft_computed: int


class Drafter(Protocol):
    """Proposes draft tokens for a step's sequences."""

    def propose(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        """One proposal per request, in order."""
        ...
