"""Drafting with a draft model whose KV cache shares the target's block tables.

The draft model keeps its own key/value pools, indexed by the same block ids as the
target's: a block the KV manager allocates, shares, copies or frees does so for both
models at once, so prefix caching, forks and preemption need nothing of their own. Each
step the draft model computes the positions the target computes (prefill chunks
included), then drafts for the decoding sequences one token per forward pass, all rows
batched. It does not write the KV of its last draft token; that position is computed at
the next step, when the draft model catches up with the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import mlx.core as mx

from mlxcel_core.cache.paged import PagedKVStorage
from mlxcel_core.engine.runner import ModelRunner, RowInput
from mlxcel_core.language_model import LanguageModel
from mlxcel_core.speculative import DraftProposal, DraftRequest


@dataclass
class _Drafting:
    """One sequence's draft in progress."""

    request: DraftRequest
    history: mx.array
    tokens: list[int] = field(default_factory=list)
    probs: list[mx.array] = field(default_factory=list)

    def proposal(self, num_draft_computed: int) -> DraftProposal:
        probs = mx.stack(self.probs) if self.probs else None
        return DraftProposal(tuple(self.tokens), probs, num_draft_computed)


class DraftModelDrafter:
    """Proposes tokens by running a smaller model autoregressively.

    A draft follows the request's own sampler: greedy requests take the draft model's
    argmax after the request's logit bias and penalties; sampled ones draw from its
    distribution after the whole chain, which is what the rejection rule divides by.

    Args:
        model: the draft model; its vocabulary must be the target's.
        storage: the draft model's KV pools, with the target's block size and block count.
        p_min: drafting of a sequence stops before a token the draft model gives less than
            this probability (llama.cpp's `--draft-p-min`).
    """

    def __init__(self, model: LanguageModel, storage: PagedKVStorage, *, p_min: float) -> None:
        self._runner = ModelRunner(model, storage)
        self.p_min = p_min

    def propose(self, requests: Sequence[DraftRequest]) -> list[DraftProposal]:
        positions = [request.num_draft_computed for request in requests]
        rows: list[RowInput] = []
        owners: list[int] = []
        for i, request in enumerate(requests):
            end = request.num_target_computed
            if end > positions[i]:
                tokens = request.token_ids[positions[i] : end]
                rows.append(RowInput(tokens, request.block_tables, positions[i]))
                owners.append(i)
                positions[i] = end
        logits = {i: out[-1] for i, out in zip(owners, self._runner.execute(rows), strict=True)}
        states = {
            i: _Drafting(request, mx.array(request.token_ids, dtype=mx.int32))
            for i, request in enumerate(requests)
            if request.num_draft_tokens > 0 and i in logits
        }
        active = {i: logits[i] for i in states}
        while active:
            draws = {i: self._draw(states[i], row_logits) for i, row_logits in active.items()}
            mx.eval([a for draw in draws.values() for a in draw if a is not None])
            rows, owners = [], []
            for i, (token, confidence, probs) in draws.items():
                state = states[i]
                if confidence.item() < self.p_min:
                    continue
                state.tokens.append(int(token.item()))
                if probs is not None:
                    state.probs.append(probs)
                if len(state.tokens) < state.request.num_draft_tokens:
                    rows.append(RowInput([state.tokens[-1]], state.request.block_tables,
                                         positions[i]))  # fmt: skip
                    owners.append(i)
                    positions[i] += 1
                    state.history = mx.concatenate([state.history, token.reshape(1)])
            outs = self._runner.execute(rows) if rows else []
            active = {i: out[-1] for i, out in zip(owners, outs, strict=True)}
        return [
            states[i].proposal(positions[i]) if i in states else DraftProposal((), None, position)
            for i, position in enumerate(positions)
        ]

    @staticmethod
    def _draw(state: _Drafting, logits: mx.array) -> tuple[mx.array, mx.array, mx.array | None]:
        """The next draft token, the draft model's probability of it, and the (V,)
        distribution it was drawn from (None for a greedy request)."""
        sampler = state.request.sampler
        if sampler.params.greedy:
            token = sampler(logits, state.history)
            return token, mx.softmax(logits.astype(mx.float32))[token], None
        processed = sampler.apply_chain(logits, state.history)
        probs = mx.softmax(processed)
        token = mx.random.categorical(processed, key=sampler.next_key()).astype(mx.int32)
        return token, probs[token], probs
