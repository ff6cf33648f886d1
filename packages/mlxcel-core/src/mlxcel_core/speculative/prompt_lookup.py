"""Prompt lookup (n-gram) drafting: propose what followed the latest earlier occurrence of
the sequence's last n tokens. No second model; good on inputs the output quotes (code
edits, summaries, retrieval). Source: Saxena, "Prompt Lookup Decoding" (2023), as vLLM's
`ngram` speculative method implements it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from mlxcel_core.speculative.drafter import DraftProposal, DraftRequest


def find_continuation(
    token_ids: Sequence[int], *, min_ngram: int, max_ngram: int, max_tokens: int
) -> tuple[int, ...]:
    """The tokens after the latest earlier match of the longest suffix n-gram.

    Tries n = max_ngram down to min_ngram; returns at most `max_tokens` tokens, or none.
    """
    tokens = np.asarray(token_ids, dtype=np.int64)
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        # Windows that start before the suffix itself does.
        windows = sliding_window_view(tokens[:-1], n)
        matches = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
        if matches.size:
            start = int(matches[-1]) + n
            return tuple(int(t) for t in tokens[start : start + max_tokens])
    return ()


class PromptLookupDrafter:
    """Drafts by n-gram lookup in the sequence's own tokens.

    Args:
        min_ngram: the shortest suffix to match (tokens, >= 1).
        max_ngram: the longest suffix to match (tokens, >= min_ngram).

    Raises:
        ValueError: a bound is out of range.
    """

    def __init__(self, *, min_ngram: int, max_ngram: int) -> None:
        if min_ngram < 1:
            raise ValueError(f"min_ngram must be >= 1, got {min_ngram}")
        if max_ngram < min_ngram:
            raise ValueError(f"max_ngram must be >= min_ngram ({min_ngram}), got {max_ngram}")
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram

    def propose(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        proposals = []
        for request in requests:
            tokens: tuple[int, ...] = ()
            if request.num_draft_tokens > 0:
                tokens = find_continuation(
                    request.token_ids,
                    min_ngram=self.min_ngram,
                    max_ngram=self.max_ngram,
                    max_tokens=request.num_draft_tokens,
                )
            proposals.append(DraftProposal(tokens, None, request.num_draft_computed))
        return proposals
