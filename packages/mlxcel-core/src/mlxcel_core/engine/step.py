"""One engine step between the scheduler's plan and its tokens: the rows the runner
computes, the draws that sample them, and which sequences may run a step ahead."""

from __future__ import annotations

from collections.abc import Hashable
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from mlxcel_core.cache.paged import InvariantError, KVCacheManager
from mlxcel_core.engine.row_sampling import (
    BatchDraw,
    Draw,
    RowTokens,
    can_draw_together,
    draw_together,
    draw_tokens,
)
from mlxcel_core.engine.runner import PendingToken, RowInput, StepLogits
from mlxcel_core.engine.scheduler import SchedulerOutput
from mlxcel_core.engine.sequence import Sequence
from mlxcel_core.speculative import AcceptanceRule, DraftProposal

# What a row whose token is pending holds in `RowInput.token_ids`.
_PLACEHOLDER = (0,)


@dataclass
class StartedStep:
    """A step the runner has begun and the engine has not read yet.

    Attributes:
        plan: the step's plan.
        proposals: each scheduled sequence's drafts (empty without speculation).
        samples: per scheduled sequence, whether the step samples its next token (false
            for a prefill chunk short of the prompt's end).
        draws: the step's draws once built: at launch when the runner returns logits at
            once, else when the step is read.
        blocks_next: a sequence of it needs its token on the host before its next step
            (a constraint, DRY): the step is read before the next is planned.
        handed_over: its draws and KV writes were handed to MLX to evaluate.
    """

    plan: SchedulerOutput
    proposals: tuple[DraftProposal, ...]
    samples: tuple[bool, ...]
    draws: list[Draw | BatchDraw] | None = None
    blocks_next: bool = False
    handed_over: bool = False


def samples_per_row(plan: SchedulerOutput) -> tuple[bool, ...]:
    """Whether each scheduled sequence reaches its last token this step (before the step
    begins: `num_computed` is still each item's `start`)."""
    return tuple(
        item.start + item.num_new_tokens >= item.sequence.num_tokens + len(item.sequence.pending)
        for item in plan.scheduled
    )


def make_rows(
    plan: SchedulerOutput, proposals: Seq[DraftProposal], kv: KVCacheManager
) -> list[RowInput]:
    """The runner's rows: each sequence's tokens from its `start`, then its drafts; a
    sequence whose next input is its pending token gets that token as a `PendingToken`.

    Raises:
        InvariantError: a sequence is scheduled past its known tokens other than for its
            one pending token.
    """
    rows = []
    for item, proposal in zip(plan.scheduled, proposals, strict=True):
        sequence = item.sequence
        start = item.start
        known = sequence.token_ids[start : start + item.num_new_tokens]
        pending = None
        if not known and item.num_new_tokens == 1 and sequence.pending:
            pending = sequence.pending[-1]
            known = list(_PLACEHOLDER)
        elif len(known) != item.num_new_tokens:
            raise InvariantError(
                f"sequence {sequence.seq_id} is scheduled for {item.num_new_tokens} tokens "
                f"from position {start} but knows {len(known)} of them"
            )
        tokens = [*known, *proposal.token_ids]
        num_logits = len(tokens) if proposal.token_ids else 1
        rows.append(
            RowInput(
                tokens,
                kv.block_tables(sequence.seq_id),
                start,
                num_logits,
                sequence.adapter_scales,
                sequence.request.images,
                state_slot=sequence.slot,
                state_source=item.state_source,
                pending=pending,
            )
        )
    return rows


def make_draws(
    started: StartedStep, logits: StepLogits, rule: AcceptanceRule
) -> list[Draw | BatchDraw]:
    """Sample the step's rows lazily: rows that `can_draw_together` by batch group, the
    others one by one, verifying their drafts."""
    plan = started.plan
    draws: list[Draw | BatchDraw] = []
    together: dict[Hashable, list[int]] = {}
    for i, (item, proposal, samples) in enumerate(
        zip(plan.scheduled, started.proposals, started.samples, strict=True)
    ):
        sequence = item.sequence
        if not samples:
            continue
        if can_draw_together(sequence, proposal.token_ids):
            together.setdefault(sequence.sampler.batch_group, []).append(i)
            continue
        draws.append(draw_tokens(sequence, logits.row(i), proposal.token_ids, proposal.probs, rule))
    for members in together.values():
        sequences = [plan.scheduled[i].sequence for i in members]
        draws.append(draw_together(sequences, logits.last(members)))
    return draws


def hold_pending(draws: Seq[Draw | BatchDraw]) -> None:
    """Append each drawn token, still on the device, to its sequence's `pending` (rows
    without drafts: a row's one token is its verdict's first)."""
    for draw in draws:
        match draw:
            case BatchDraw(sequences=sequences, tokens=tokens):
                for i, sequence in enumerate(sequences):
                    sequence.pending.append(PendingToken(tokens, i))
            case Draw(sequence=sequence, verdict=verdict):
                sequence.pending.append(PendingToken(verdict.tokens, 0))


def needs_host_tokens(sequence: Sequence) -> bool:
    """Whether sampling the sequence's next token reads its tokens on the host: a token
    constraint (structured output, a reasoning budget) or an active DRY stage."""
    return sequence.request.constraint is not None or sequence.sampler.reads_history_on_host


def can_run_ahead(sequence: Sequence, samples: bool) -> bool:
    """Whether the sequence's next step may start before this one is read: its next input
    is known (the rest of its prompt) or is its pending token, with tokens left to generate
    after the pending ones and nothing in its sampling that reads tokens on the host."""
    if not samples:
        return True
    return sequence.num_tokens_left > 0 and not needs_host_tokens(sequence)


def append_tokens(emitted: Seq[RowTokens]) -> tuple[list[RowTokens], dict[int, int]]:
    """Append each read row's tokens to its sequence, oldest pending token first off its
    `pending`; a sequence that ended since its step began has its tokens discarded.

    Returns:
        The rows kept, and per `seq_id` the drafts accepted (its tokens less one).
    """
    live, num_accepted = [], {}
    for row in emitted:
        sequence = row.sequence
        if sequence.pending:
            sequence.pending.popleft()
        if sequence.status.finished:
            continue
        live.append(row)
        sequence.token_ids.extend(token for token, _ in row.tokens)
        accepted = len(row.tokens) - 1
        num_accepted[sequence.seq_id] = accepted
        sequence.num_draft_tokens += row.num_drafts
        sequence.num_accepted_draft_tokens += accepted
    return live, num_accepted
