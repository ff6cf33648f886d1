"""Sampling the rows of a batched step: each row with its own request's chain, constraint
and stream, verifying the row's draft tokens when it has some (speculative decoding); rows
whose chains need none of that draw together, in a fixed number of ops (`BatchDraw`)."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import mlx.core as mx

from mlxcel_core.engine.sequence import Sequence
from mlxcel_core.logprobs import PendingLogprobs, TokenLogprobs, make_logprobs
from mlxcel_core.sampling import sample_batch
from mlxcel_core.sampling.constraint import apply_constraint
from mlxcel_core.speculative import (
    AcceptanceRule,
    Verdict,
    exact_match,
    num_leading_accepted,
    rejection_sample,
)
from mlxcel_core.stopping import ban_tokens, ban_unless_alone


@dataclass(frozen=True)
class RowTokens:
    """What one row emits this step.

    Attributes:
        sequence: the row's sequence.
        num_drafts: the drafts the row verified.
        tokens: the tokens to emit, in order (the accepted drafts, then one more), each with
            its log probabilities when the request asked for them.
    """

    sequence: Sequence
    num_drafts: int
    tokens: list[tuple[int, TokenLogprobs | None]]


@dataclass(frozen=True)
class Draw:
    """A row's verified tokens and log probabilities, not yet evaluated.

    Attributes:
        sequence: the row's sequence.
        draft_token_ids: the drafts the row verified (none without speculation).
        verdict: which drafts pass and the token to emit where the chain stops.
        logprobs: per position 0..k, the log probabilities of the token emitted there when
            the request asked for them, else None.
    """

    sequence: Sequence
    draft_token_ids: tuple[int, ...]
    verdict: Verdict
    logprobs: tuple[PendingLogprobs, ...] | None

    def arrays(self) -> list[mx.array]:
        """Everything to evaluate with the step."""
        pending = () if self.logprobs is None else self.logprobs
        return [*self.verdict.arrays(), *(a for p in pending for a in p.arrays())]

    def emitted(self) -> list[RowTokens]:
        """The row's tokens, once evaluated."""
        num_accepted = num_leading_accepted(self.verdict.accepted.tolist())
        tokens = [*self.draft_token_ids[:num_accepted], int(self.verdict.tokens[num_accepted])]
        if self.logprobs is None:
            pairs = [(token, None) for token in tokens]
        else:
            pairs = [(t, p.read(t)) for t, p in zip(tokens, self.logprobs, strict=False)]
        return [RowTokens(self.sequence, len(self.draft_token_ids), pairs)]


@dataclass(frozen=True)
class BatchDraw:
    """Rows sampled together: one token each, no drafts, no log probabilities.

    Attributes:
        sequences: the rows' sequences.
        tokens: (rows,) int32 token ids, not yet evaluated.
    """

    sequences: tuple[Sequence, ...]
    tokens: mx.array

    def arrays(self) -> list[mx.array]:
        """Everything to evaluate with the step."""
        return [self.tokens]

    def emitted(self) -> list[RowTokens]:
        """Each row's token, once evaluated."""
        return [
            RowTokens(sequence, 0, [(token, None)])
            for sequence, token in zip(self.sequences, self.tokens.tolist(), strict=True)
        ]


def token_history(sequence: Sequence) -> mx.array:
    """(T,) int32: the sequence's tokens, its pending ones read on the device."""
    history = mx.array(sequence.token_ids, dtype=mx.int32)
    if not sequence.pending:
        return history
    pending = [p.tokens[p.index : p.index + 1] for p in sequence.pending]
    return mx.concatenate([history, *pending])


def can_draw_together(sequence: Sequence, drafts: tuple[int, ...]) -> bool:
    """Whether the row's token needs nothing of `draw_tokens` beyond its sampler's chain,
    which then has a batch group (see `Sampler.batch_group`)."""
    request = sequence.request
    return (
        not drafts
        and request.constraint is None
        and request.generation.num_top_logprobs is None
        and sequence.sampler.batch_group is not None
    )


def draw_together(sequences: Seq[Sequence], logits: mx.array) -> BatchDraw:
    """Sample rows that `can_draw_together` and share a batch group, lazily.

    Args:
        sequences: the rows' sequences.
        logits: (rows, V) logits after each sequence's last token.
    """
    logits = ban_tokens(logits, [_banned(sequence) for sequence in sequences])
    tokens = sample_batch([sequence.sampler for sequence in sequences], logits)
    return BatchDraw(tuple(sequences), tokens)


def _banned(sequence: Sequence, ahead: int = 0) -> frozenset[int]:
    """The stop tokens the draw `ahead` tokens after the sequence's next one may not give,
    counting its pending tokens as generated (they come before it)."""
    return sequence.text.banned_token_ids(len(sequence.pending) + ahead)


def _constrain(
    sequence: Sequence, logits: mx.array, drafts: tuple[int, ...]
) -> tuple[list[mx.array], tuple[int, ...]]:
    """Each position's logits under the request's constraint (the state after the drafts
    before it) and its stop-token ban (`TextAssembler.banned_token_ids`).

    Drafts from the first one the constraint forbids on are dropped (they cannot pass). The
    constraint is left as it was found.
    """
    constraint = sequence.request.constraint
    bans = [_banned(sequence, j) for j in range(len(drafts) + 1)]
    if constraint is None:
        return [ban_tokens(logits[j : j + 1], [bans[j]])[0] for j in range(len(drafts) + 1)], drafts
    rows = []
    for j in range(len(drafts) + 1):
        allowed = constraint.allowed_mask(logits.shape[-1])
        banned = ban_unless_alone(allowed, bans[j])
        rows.append(ban_tokens(apply_constraint(logits[j], allowed)[None], [banned])[0])
        if j == len(drafts) or not allowed[drafts[j]].item():
            break
        constraint.advance(drafts[j])
    constraint.rollback(len(rows) - 1)
    return rows, drafts[: len(rows) - 1]


def draw_tokens(
    sequence: Sequence,
    logits: mx.array,
    drafts: tuple[int, ...],
    draft_probs: mx.array | None,
    rule: AcceptanceRule,
) -> Draw:
    """Verify `sequence`'s drafts and sample what follows the accepted ones, lazily.

    Each position's logits go through the request's whole chain (constraint, logit bias,
    penalties over the history including the drafts before it, the sampler stages): the
    target distribution is the one plain decoding samples from. Greedy requests and rows
    without drafts use the `EXACT` rule, which then is plain sampling; log probabilities
    are those of the raw logits.

    Args:
        logits: (k + 1, V) logits after the sequence's last token and after each draft.
        drafts: the k draft tokens.
        draft_probs: (k, V) float32 distributions the drafts were drawn from, or None
            for deterministic drafts.
        rule: the acceptance rule for sampled (temperature > 0) requests.
    """
    request = sequence.request
    sampler = sequence.sampler
    rows, drafts = _constrain(sequence, logits, drafts)
    k = len(drafts)
    draft_array = mx.array(drafts, dtype=mx.int32)
    history = token_history(sequence)
    histories = [history] + [mx.concatenate([history, draft_array[:j]]) for j in range(1, k + 1)]
    if k == 0 or rule is AcceptanceRule.EXACT or sampler.params.greedy:
        target = mx.stack([sampler(rows[j], histories[j]) for j in range(k + 1)])
        verdict = exact_match(target, draft_array)
    else:
        probs = mx.stack(
            [mx.softmax(sampler.apply_chain(rows[j], histories[j])) for j in range(k + 1)]
        )
        q = None if draft_probs is None else draft_probs[:k]
        verdict = rejection_sample(probs, draft_array, q, sampler.next_key())
    num_top = request.generation.num_top_logprobs
    logprobs = None
    if num_top is not None:
        candidates = mx.concatenate(
            [mx.where(verdict.accepted, draft_array, verdict.tokens[:k]), verdict.tokens[k:]]
        )
        logprobs = tuple(make_logprobs(logits[j], candidates[j], num_top) for j in range(k + 1))
    return Draw(sequence, drafts, verdict, logprobs)
